"""Tests of :mod:`lightning_zerocopy.sampling.hybrid.policy`: the placement policy against a fake clock and fake costs,
the threaded dispatcher's ordering, determinism and fault handling."""

from __future__ import annotations

import heapq
import random
import threading
from collections import deque
from typing import Callable

import pytest
import torch

from lightning_zerocopy.graph import CSCGraph
from lightning_zerocopy.sampling import NeighborSampler
from lightning_zerocopy.sampling.hybrid.policy import HybridDispatcher, HybridPolicy

Cost = Callable[[str, float, int], float]  # (lane, size, batch index) -> seconds


def simulate(policy: HybridPolicy, cost: Cost, sizes: list[float], depth: int) -> tuple[list[str], float]:
    """Discrete-event run of the policy: FIFO lanes, ``depth`` batches in flight, batches taken in order.

    Returns the lane of every batch and the time the last one finished.
    """
    queues = {lane: deque() for lane in policy.lanes}
    busy = {lane: False for lane in policy.lanes}
    events: list = []  # (finish time, key, lane)
    done: dict[int, float] = {}
    chosen: list[str] = []
    now = 0.0

    def start(lane: str, t: float) -> None:
        if busy[lane] or not queues[lane]:
            return
        key = queues[lane].popleft()
        busy[lane] = True
        policy.started(lane, key, t)
        heapq.heappush(events, (t + cost(lane, sizes[key], key), key, lane))

    def advance() -> None:
        nonlocal now
        t, key, lane = heapq.heappop(events)
        now = max(now, t)
        busy[lane] = False
        policy.finished(lane, key, sizes[key], cost(lane, sizes[key], key))
        done[key] = t
        start(lane, t)

    for i, size in enumerate(sizes):
        if i >= depth:
            while i - depth not in done:
                advance()
        lane = policy.choose(size, now)
        policy.dispatched(lane, i, size)
        chosen.append(lane)
        queues[lane].append(i)
        start(lane, now)
    while events:
        advance()
    return chosen, max(done.values())


def _sizes(n: int, seed: int = 0, lo: float = 1e4, hi: float = 1e5) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(lo, hi) for _ in range(n)]


def _linear(a: float, b: float) -> Callable[[float], float]:
    return lambda size: a + b * size


def test_converges_to_the_cheaper_device_one_batch_at_a_time() -> None:
    costs = {"cpu": _linear(5e-3, 2e-7), "gpu": _linear(1e-3, 2e-8)}
    policy = HybridPolicy(["cpu", "gpu"], explore_every=50)
    chosen, _ = simulate(policy, lambda lane, size, i: costs[lane](size), _sizes(400), depth=1)
    tail = chosen[-200:]
    assert tail.count("gpu") >= 0.97 * len(tail)  # the rest are the periodic probes of the cpu lane
    assert "cpu" in tail  # ... which keep its model fresh
    assert policy.model("gpu").predict(5e4) == pytest.approx(costs["gpu"](5e4), rel=0.01)


def test_moves_when_the_gpu_gets_busy_and_back_when_it_frees() -> None:
    base = {"cpu": _linear(3e-3, 5e-8), "gpu": _linear(5e-4, 1e-8)}

    def cost(lane: str, size: float, i: int) -> float:
        slow = 20.0 if lane == "gpu" and 300 <= i < 600 else 1.0  # training starts on the GPU, then stops
        return slow * base[lane](size)

    chosen, _ = simulate(HybridPolicy(["cpu", "gpu"], explore_every=20), cost, _sizes(900, seed=1), depth=1)
    assert chosen[200:300].count("gpu") >= 90
    assert chosen[450:600].count("cpu") >= 135
    assert chosen[750:900].count("gpu") >= 135


def test_splits_by_size_when_each_device_wins_a_range() -> None:
    # the CPU has no launch overhead and wins small batches; the GPU wins large ones
    costs = {"cpu": _linear(1e-4, 1e-7), "gpu": _linear(2e-3, 1e-8)}
    sizes = _sizes(600, seed=2, lo=1e3, hi=1e5)
    policy = HybridPolicy(["cpu", "gpu"])
    chosen, _ = simulate(policy, lambda lane, size, i: costs[lane](size), sizes, depth=1)
    late = list(zip(sizes, chosen))[200:]
    crossover = 1.9e-3 / 9e-8  # ~21k
    right = sum((lane == "cpu") == (size < crossover) for size, lane in late if abs(size - crossover) > 3e3)
    total = sum(1 for size, _ in late if abs(size - crossover) > 3e3)
    assert right >= 0.97 * total


def test_runs_both_devices_concurrently_and_beats_the_better_one() -> None:
    costs = {"cpu": _linear(2e-3, 0.0), "gpu": _linear(1e-3, 0.0)}
    sizes = _sizes(600, seed=3)
    chosen, makespan = simulate(HybridPolicy(["cpu", "gpu"]), lambda lane, s, i: costs[lane](s), sizes, depth=4)
    gpu_only, _ = 600 * 1e-3, None
    assert makespan < 0.75 * gpu_only
    assert 0.55 <= chosen[100:].count("gpu") / 500 <= 0.8  # ~2/3 at rates 1000/s vs 500/s


@pytest.mark.parametrize("cpu_seconds, keep", [(2e-3, ("cpu", "gpu")), (50e-3, ("gpu",))])
def test_auto_keeps_both_devices_only_where_that_pays(cpu_seconds: float, keep: tuple[str, ...]) -> None:
    costs = {"cpu": _linear(cpu_seconds, 0.0), "gpu": _linear(1e-3, 0.0)}
    policy = HybridPolicy(["cpu", "gpu"], mode="auto", auto_after=40)
    chosen, _ = simulate(policy, lambda lane, s, i: costs[lane](s), _sizes(300, seed=4), depth=4)
    assert policy.stats.auto_choice == keep
    if keep == ("gpu",):
        assert chosen[100:].count("cpu") == 0 and policy.active_lanes == ["gpu"]


def test_policy_statistics_and_warmup() -> None:
    policy = HybridPolicy(["cpu", "gpu"], warmup=1)
    costs = {"cpu": 4e-3, "gpu": 1e-3}
    simulate(policy, lambda lane, s, i: costs[lane] * (50 if i < 2 else 1), [1e4] * 50, depth=1)
    stats = policy.stats
    assert stats.lanes["cpu"].batches + stats.lanes["gpu"].batches == 50
    assert stats.share("gpu") > 0.8
    # the first (slow, one-time setup) measurement of each lane was not fed to its model
    assert policy.model("gpu").predict(1e4) == pytest.approx(1e-3, rel=1e-3)
    assert stats.last is not None and stats.last.key == 49


def test_policy_checks_arguments() -> None:
    with pytest.raises(ValueError, match="lanes"):
        HybridPolicy(["cpu", "cpu"])
    with pytest.raises(ValueError, match="mode"):
        HybridPolicy(["cpu"], mode="fastest")  # type: ignore[arg-type]


# ---- the threaded dispatcher ------------------------------------------------------------------------------


class FakeClock:
    """A clock that only moves when a fake sampler spends time, separately on each thread (a lane's measured time
    is exactly what its samples spent, whatever runs concurrently on other lanes)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return getattr(self._local, "now", 0.0)

    def spend(self, seconds: float) -> None:
        self._local.now = self() + seconds


def test_dispatcher_with_fake_clock_converges_and_moves() -> None:
    clock = FakeClock()
    cost = {"cpu": 4e-3, "gpu": 1e-3}
    dispatcher = HybridDispatcher(HybridPolicy(["cpu", "gpu"], explore_every=25), clock=clock)

    def sample(lane: str) -> str:
        clock.spend(cost[lane])
        return lane

    lanes = []
    try:
        for step in range(300):
            if step == 150:
                cost["gpu"] = 20e-3  # the GPU got busy
            dispatcher.submit(step, 1e4, sample)
            lane, record = dispatcher.take(step)  # one batch in flight: deterministic under the fake clock
            assert record is not None and record.lane == lane and record.measured_s == pytest.approx(cost[lane])
            lanes.append(lane)
    finally:
        dispatcher.close()
    assert lanes[50:150].count("gpu") >= 94
    assert lanes[200:300].count("cpu") >= 94
    assert dispatcher.stats.lanes["cpu"].batches + dispatcher.stats.lanes["gpu"].batches == 300


class RandomPolicy(HybridPolicy):
    """Places every batch on a random lane: any dispatch must give the same batches."""

    def __init__(self, lanes: list[str], seed: int) -> None:
        super().__init__(lanes)
        self._rng = random.Random(seed)

    def choose(self, size: float, now: float, **kwargs) -> str:
        return self._rng.choice(self.lanes)


def test_batches_are_the_cpu_samplers_whatever_the_dispatch() -> None:
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 400, (2, 4000), generator=gen)
    graph = CSCGraph.from_edge_index(edge_index, 400)
    reference = NeighborSampler(graph, fanouts=[5, 3])
    lanes = {"a": NeighborSampler(graph, fanouts=[5, 3], num_threads=1),
             "b": NeighborSampler(graph, fanouts=[5, 3], num_threads=2)}  # fmt: skip
    seeds = [torch.randperm(400, generator=gen)[:32] for _ in range(24)]
    for dispatch_seed in range(3):
        dispatcher = HybridDispatcher(RandomPolicy(["a", "b"], dispatch_seed))
        try:
            for step in range(4):  # four in flight: lanes finish out of order, results come back in order
                dispatcher.submit(step, 1.0, lambda lane, s=step: lanes[lane].sample(seeds[s], seed=s))
            for step in range(len(seeds)):
                got, record = dispatcher.take(step)
                if step + 4 < len(seeds):
                    nxt = step + 4
                    dispatcher.submit(nxt, 1.0, lambda lane, s=nxt: lanes[lane].sample(seeds[s], seed=s))
                want = reference.sample(seeds[step], seed=step)
                assert torch.equal(got.n_id, want.n_id) and torch.equal(got.edge_index, want.edge_index)
                assert torch.equal(got.e_id, want.e_id) and got.num_sampled_edges == want.num_sampled_edges
                assert record is not None and record.key == step
            assert {lane for lane, s in dispatcher.stats.lanes.items() if s.batches} == {"a", "b"}
        finally:
            dispatcher.close()


def test_a_failing_sampling_thread_raises_in_the_taker() -> None:
    dispatcher = HybridDispatcher(RandomPolicy(["cpu", "gpu"], 0))

    def sample(step: int, lane: str) -> int:
        if step == 2:
            raise IndexError(f"seed node id 99 is out of range (batch {step} on {lane})")
        return step

    try:
        for step in range(5):
            dispatcher.submit(step, 1.0, lambda lane, s=step: sample(s, lane))
        assert [dispatcher.take(s)[0] for s in (0, 1)] == [0, 1]
        with pytest.raises(IndexError, match="seed node id 99 is out of range \\(batch 2"):
            dispatcher.take(2)
        assert [dispatcher.take(s)[0] for s in (3, 4)] == [3, 4]  # the lane threads survive the error
        for lane in ("cpu", "gpu"):
            assert dispatcher.policy.backlog(lane, 0.0) == 0.0  # the failed batch left no phantom backlog
        with pytest.raises(KeyError):
            dispatcher.take(7)
        dispatcher.submit(5, 1.0, lambda lane: 5)
        with pytest.raises(ValueError, match="already queued"):
            dispatcher.submit(5, 1.0, lambda lane: 5)
        dispatcher.drop()
        assert 5 not in dispatcher
    finally:
        dispatcher.close()


def test_run_places_and_measures_on_the_calling_thread() -> None:
    clock = FakeClock()
    dispatcher = HybridDispatcher(HybridPolicy(["cpu", "gpu"], warmup=0), clock=clock)
    caller = threading.get_ident()
    threads = set()

    def sample(lane: str) -> str:
        threads.add(threading.get_ident())
        clock.spend({"cpu": 1e-3, "gpu": 3e-3}[lane])
        return lane

    try:
        lanes = [dispatcher.run(step, 1e4, sample)[0] for step in range(40)]
    finally:
        dispatcher.close()
    assert threads == {caller}
    assert lanes[10:].count("cpu") >= 29


def test_drop_forgets_queued_batches_and_their_backlog() -> None:
    gate = threading.Event()
    dispatcher = HybridDispatcher(HybridPolicy(["cpu"], warmup=0))
    try:
        dispatcher.submit(("train", 0), 1.0, lambda lane: gate.wait(10))  # runs, blocks the lane
        for step in range(1, 4):
            dispatcher.submit(("train", step), 1.0, lambda lane: 0)
        dispatcher.submit(("val", 0), 1.0, lambda lane: "val")
        dispatcher.drop(lambda key: key[0] == "train")
        assert ("train", 2) not in dispatcher and ("val", 0) in dispatcher
        assert len(dispatcher.policy._lanes["cpu"].pending) == 2  # the running train batch and val's
        gate.set()
        assert dispatcher.take(("val", 0))[0] == "val"
        assert dispatcher.policy._lanes["cpu"].pending == {}
    finally:
        gate.set()
        dispatcher.close()


@pytest.mark.parametrize("placement", ["hybrid", "auto"])
def test_a_single_sampler_does_not_take_a_builder_level_placement(placement) -> None:
    graph = CSCGraph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), 2)
    with pytest.raises(ValueError, match="`placement` must be 'cpu', 'uva' or 'gpu'"):
        NeighborSampler(graph, fanouts=[2], placement=placement)


def test_probes_are_shadow_samples_that_never_delay_a_batch_and_keep_the_idle_lane_calibrated() -> None:
    clock = FakeClock()
    cost = {"cpu": 4e-3, "gpu": 1e-3}
    dispatcher = HybridDispatcher(HybridPolicy(["cpu", "gpu"], explore_every=10), clock=clock)
    ran: list[tuple[int, str]] = []

    def sample(step: int, lane: str) -> int:
        ran.append((step, lane))
        clock.spend(cost[lane])
        return step

    try:
        lanes = []
        for step in range(200):
            if step == 100:
                cost["cpu"] = 0.5e-3  # the CPU got freer: only the probes can tell
            lane = dispatcher.submit(step, 1e4, lambda lane, s=step: sample(s, lane))
            assert dispatcher.take(step)[0] == step
            lanes.append(lane)
    finally:
        dispatcher.close()
    stats = dispatcher.stats
    assert stats.probes >= 10  # shadow samples ran on the idle lane ...
    assert sum(s.batches for s in stats.lanes.values()) == 200  # ... and are not counted as its batches
    assert lanes[20:100].count("gpu") == 80  # no batch of the faster lane was put on the slower one to probe it
    assert lanes[150:].count("cpu") == 50  # the probes saw the CPU get faster
    assert dispatcher.policy.model("cpu").predict(1e4) == pytest.approx(0.5e-3, rel=0.05)


def test_a_preferred_lane_takes_every_batch_it_can_finish_before_its_deadline() -> None:
    policy = HybridPolicy(["cpu", "gpu"], prefer="cpu", warmup=0)
    for lane, seconds in (("cpu", 8e-3), ("gpu", 1e-3)):
        policy.dispatched(lane, lane, 1e4)
        policy.finished(lane, lane, 1e4, seconds)
    assert policy.choose(1e4, now=0.0) == "gpu"  # no deadline: the earliest finish
    assert policy.choose(1e4, now=0.0, deadline=0.010) == "cpu"  # the CPU makes it in time: keep the GPU free
    policy.dispatched("cpu", "queued", 1e4)  # 8 ms already queued on the CPU
    assert policy.choose(1e4, now=0.0, deadline=0.010) == "gpu"  # 16 ms would miss the deadline
    with pytest.raises(ValueError, match="prefer"):
        HybridPolicy(["cpu", "gpu"], prefer="tpu")
