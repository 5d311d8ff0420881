"""ZeroCopyDDPStrategy in CPU DDP jobs (gloo, subprocesses): seed shares, one host copy per machine, the cache plan
on every rank, simulated nodes, and a rank that dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port, sigint_at_default
from helpers.test_gpus import TEST_GPUS, skip_unless_enough_gpus

from lightning_zerocopy.cache.cached_rows import fits_a_row, lookup_bytes

SCRIPT = Path(__file__).parents[1] / "scripts" / "strategy_ddp_script.py"


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _launch(tmp_path: Path, config: dict[str, Any], node_rank: int = 0, port: int = 0,
            new_session: bool = False) -> subprocess.Popen:  # fmt: skip
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    config = dict(config, out=str(out), cache=str(tmp_path / "cache"))
    path = tmp_path / f"config{node_rank}.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONUNBUFFERED="1", NODE_RANK=str(node_rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port or free_port()), OMP_NUM_THREADS="1")  # fmt: skip
    for key in ("LOCAL_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK"):
        env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=new_session, preexec_fn=sigint_at_default,
    )  # fmt: skip


def _run(tmp_path: Path, config: dict[str, Any], nodes: int = 1, timeout: float = 240) -> list[dict[str, Any]]:
    port = free_port()
    procs = [_launch(tmp_path, config, node_rank=n, port=port) for n in range(nodes)]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-6000:]
    world = config.get("devices", 2) * nodes
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(world)]


def _check_shares(reports: list[dict[str, Any]], batch_size: int = 64) -> None:
    shares = [[s for batch in r["seeds"] for s in batch] for r in reports]
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) > 0  # equal shares
    flat = [s for share in shares for s in share]
    assert len(set(flat)) == len(flat)  # disjoint
    train = set(reports[0]["train_idx"])
    assert set(flat) <= train and len(train) - len(flat) < len(reports) * batch_size


def _check_one_copy(reports: list[dict[str, Any]]) -> None:
    """Ranks of one node map the same segments, and their PSS adds up to about one copy."""
    assert len({tuple(r["paths"]) for r in reports}) == 1
    size = reports[0]["segment_bytes"]
    assert all(r["rss"] >= 0.9 * size for r in reports)  # each rank maps (and touched) all of it
    total_pss = sum(r["pss"] for r in reports)
    # one copy shared by the ranks: ~1x what one rank maps (a copy per rank would be len(reports) x)
    assert total_pss <= 1.5 * max(r["rss"] for r in reports), (total_pss, [r["rss"] for r in reports])


def _check_no_leftovers(before: set[str], tmp_path: Path) -> None:
    pids = {p.read_text().strip() for p in (tmp_path / "out").glob("pid*")}
    left = {n for n in _shm() - before if any(n.startswith(f"lzc-{pid}-") for pid in pids)}
    assert not left, left


@pytest.mark.slow
def test_two_ranks_presample_replicate(tmp_path: Path) -> None:
    before = _shm()
    # 4 KiB of rows beside the lookup every GPU builds over the 2000-row table (4 B per row: 8000 B)
    reports = _run(tmp_path, {"devices": 2, "ranking": "presample", "policy": "replicate", "budget": 4096 + 8000})
    _check_shares(reports)
    _check_one_copy(reports)
    assert {r["digest"] for r in reports} == {reports[0]["digest"]}  # the same plan on every rank
    assert reports[0]["policy"] == "replicate" and [r["group"] for r in reports] == [[0], [1]]
    assert len(reports[0]["rows"]) == 4096 // 32  # 8 fp32 features per row
    assert 0 < reports[0]["expected_hit_rate"] < 1
    _check_no_leftovers(before, tmp_path)
    (tmp_path / "two.json").write_text(json.dumps(reports[0]["rows"]))

    # four ranks, cliques from a given peer matrix ({0,1} and {2,3}), each caching as many rows as one GPU above:
    # the same presample counts (rank-independent) and row count give the same hottest rows, dealt over two shards
    four = tmp_path / "four"
    four.mkdir()
    peer = [[i // 2 == j // 2 for j in range(4)] for i in range(4)]
    reports4 = _run(four, {"devices": 4, "ranking": "presample", "policy": "clique", "budget": 2048 + 8000,
                           "peer_access": peer})  # fmt: skip
    _check_shares(reports4)
    _check_one_copy(reports4)
    assert {r["digest"] for r in reports4} == {reports4[0]["digest"]}
    assert [r["group"] for r in reports4] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["shard_index"] for r in reports4] == [0, 1, 0, 1]
    rows, bounds = reports4[0]["rows"], reports4[0]["bounds"]
    shard0, shard1 = rows[bounds[0] : bounds[1]], rows[bounds[1] : bounds[2]]
    assert len(shard0) == len(shard1) == 64 and not set(shard0) & set(shard1)
    hottest = [r for pair in zip(shard0, shard1) for r in pair]  # undo the round-robin deal
    assert hottest == reports[0]["rows"]
    _check_no_leftovers(before, four)


@pytest.mark.slow
def test_two_simulated_nodes_each_build_their_own_host_copy(tmp_path: Path) -> None:
    before = _shm()
    reports = _run(tmp_path, {"devices": 2, "num_nodes": 2, "ranking": "degree", "policy": "clique",
                              "peer_access": [[True, True], [True, True]]}, nodes=2)  # fmt: skip
    assert [(r["node_rank"], r["local_rank"]) for r in reports] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _check_shares(reports)
    node0, node1 = reports[:2], reports[2:]
    _check_one_copy(node0)
    _check_one_copy(node1)
    assert set(node0[0]["paths"]).isdisjoint(node1[0]["paths"])  # each machine its own copy
    assert [r["group"] for r in reports] == [[0, 1], [0, 1], [2, 3], [2, 3]]  # caches never span machines
    assert {r["digest"] for r in reports} == {reports[0]["digest"]}
    _check_no_leftovers(before, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("die_rank", [1, 0])
def test_a_dead_rank_stops_the_others_with_its_name(tmp_path: Path, die_rank: int) -> None:
    before = _shm()
    start = time.monotonic()
    proc = _launch(tmp_path, {"devices": 2, "epochs": 50, "die_rank": die_rank,
                              "liveness_interval": float(os.environ.get("LZC_TEST_LIVENESS", "0.5"))})  # fmt: skip
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode != 0
    out = tmp_path / "out"
    assert (out / f"dying{die_rank}").exists(), output[-4000:]
    survivor = 1 - die_rank
    pid = int((out / f"pid{survivor}").read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"rank {survivor} still runs 30 s after rank {die_rank} died")
    dying_at = (out / f"dying{die_rank}").stat().st_mtime
    assert time.time() - dying_at < 60 and time.monotonic() - start < 240
    # the survivor names the dead rank (every rank writes to the launcher's output)
    assert f"rank {die_rank} (pid" in output and f"exited while rank {survivor} was running" in output, output[-4000:]
    _check_no_leftovers(before, tmp_path)


@pytest.mark.slow
def test_a_pipeline_worker_dying_on_rank_1_is_named_in_rank_0s_error(tmp_path: Path) -> None:
    """Rank 1's pipeline worker is SIGKILLed: rank 1 fails naming the worker, and rank 0's error names that root
    cause too (the worker's pid and signal), not only "rank 1 exited" (issue 22, Faults). Every process of the job
    has ended (the launcher's output closed) within 4 s of the kill: 5.4 s before issue 42's cuts (rank 1 waited
    2 s for a peer to blame, rank 0 1.5 s for its watch's thread), 1.9 s after, on a loaded 2-core machine; the
    four-GPU run's bound is 10 s."""
    proc = _launch(tmp_path, {"devices": 2, "epochs": 50, "pipeline": True, "kill_worker_rank": 1})
    output = proc.communicate(timeout=300)[0]
    took = time.time() - (tmp_path / "out" / "worker1").stat().st_mtime  # written just before the kill
    assert proc.returncode != 0
    assert took < 4.0, (took, output[-6000:])
    worker = int((tmp_path / "out" / "worker1").read_text())
    cause = f"the pipeline worker process (pid {worker}) was killed by SIGKILL"
    assert f"failed while rank 0 was running: PipelineError: {cause}" in output, output[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize("whom", ["job", "rank1"])
def test_ctrl_c_under_ddp_says_interrupted_and_blames_no_rank(tmp_path: Path, whom: str) -> None:
    """Ctrl-C reaches every rank of the job (one process group): no rank says another "exited while rank 0 was
    running". SIGINT to rank 1 alone: rank 0 says rank 1 "was interrupted (SIGINT)" (issue 22, Faults). Rank 0
    shuts down slowly (as with a GPU pipeline), so rank 1 is gone while rank 0's watch still runs."""
    import signal

    out = tmp_path / "out"
    proc = _launch(tmp_path, {"devices": 2, "epochs": 50, "dawdle": 0.05, "slow_exception_rank": 0}, new_session=True)
    deadline = time.monotonic() + 240
    while not all((out / f"training{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        time.sleep(0.1)
    time.sleep(1.0)  # both ranks mid-epoch
    if whom == "job":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(int((out / "pid1").read_text()), signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert "exited while rank" not in output and "failed while rank" not in output, output[-4000:]
    if whom == "rank1":
        assert "rank 1 (pid " in output and "was interrupted (SIGINT); stopping rank 0" in output, output[-4000:]
    else:
        assert "Detected KeyboardInterrupt" in output, output[-4000:]


@pytest.mark.slow
def test_rank_0_killed_while_rank_1_starts_stops_rank_1(tmp_path: Path) -> None:
    """The launcher (rank 0) dies before the rendezvous: the rank it started stops within seconds, naming it, instead
    of waiting for the rendezvous timeout."""
    import signal

    from helpers import FAULT_BOUND_S as SLACK_S
    from helpers import launched_ranks

    proc = _launch(tmp_path, {"devices": 2, "epochs": 5}, new_session=True)
    deadline = time.monotonic() + 300
    while not launched_ranks(proc.pid, SCRIPT.name):
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "rank 0 started no rank"
        time.sleep(0.02)
    rank1 = launched_ranks(proc.pid, SCRIPT.name)[0]
    os.kill(proc.pid, signal.SIGKILL)
    gone = False
    deadline = time.monotonic() + SLACK_S
    while time.monotonic() < deadline and not gone:
        try:
            os.kill(rank1, 0)
            time.sleep(0.05)
        except ProcessLookupError:
            gone = True
    if not gone:
        os.kill(rank1, signal.SIGKILL)
    output = proc.communicate(timeout=60)[0]
    assert gone, f"rank 1 still ran {SLACK_S} s after rank 0 was killed: {output[-3000:]}"
    assert f"rank 0 (pid {proc.pid} on" in output and "exited while rank 1 was starting" in output, output[-4000:]


# ---- two GPUs (NCCL, the zero-copy gather; every batch's features are checked against the host table) ----


#: the two-GPU tests' graph (strategy_ddp_script.py: 8 float32 features a node)
GPU_GRAPH_NODES, GPU_GRAPH_ROW_BYTES = 20000, 8 * 4


def _half_the_rows_over(gpus: int) -> int:
    """A per-GPU budget (bytes) for which a clique over ``gpus`` GPUs holds about half the graph's rows, besides
    its lookup: every source (local, peer, host) serves some row, and no single GPU holds the hot rows (``auto``
    weighs the two layouts). 64 KiB held less than the 20,000-row lookup alone (80 KB), so no cache was placed."""
    return lookup_bytes(GPU_GRAPH_NODES, gpus) + GPU_GRAPH_NODES * GPU_GRAPH_ROW_BYTES // (2 * gpus)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_two_gpu_tests_budget_caches_some_rows_and_not_all(gpus: int) -> None:
    budget = _half_the_rows_over(gpus)
    assert fits_a_row(budget, {"_N": GPU_GRAPH_NODES}, {"_N": GPU_GRAPH_ROW_BYTES}, gpus)
    rows_per_gpu = (budget - lookup_bytes(GPU_GRAPH_NODES, gpus)) // GPU_GRAPH_ROW_BYTES
    assert 0 < rows_per_gpu * gpus < GPU_GRAPH_NODES and rows_per_gpu < GPU_GRAPH_NODES // 2


@pytest.mark.two_gpus
@pytest.mark.parametrize("pipeline", [False, True], ids=["in_process", "worker"])
def test_clique_on_two_gpus_reads_peer_shards_and_gathers_the_right_rows(tmp_path: Path, pipeline: bool) -> None:
    """Each rank's cache reads its own shard, the peers' shards (opened over CUDA IPC for its GPU) and host memory;
    before the shards were opened for the reading GPU, the peer reads faulted (illegal address), in the trainer and
    in the pipeline worker. ``LZC_TEST_GPUS=N``: one clique of N shards on N ranks."""
    skip_unless_enough_gpus()
    before = _shm()
    reports = _run(tmp_path, {"accelerator": "gpu", "devices": TEST_GPUS, "policy": "clique", "budget": _half_the_rows_over(TEST_GPUS),
                              "num_nodes_graph": GPU_GRAPH_NODES, "pipeline": pipeline})  # fmt: skip
    everyone = list(range(TEST_GPUS))
    assert [r["group"] for r in reports] == [everyone] * TEST_GPUS and reports[0]["policy"] == "clique"
    for r in reports:
        rows = r["cache_rows"]
        assert rows["local_rows"] > 0 and rows["peer_rows"] > 0 and rows["host_rows"] > 0, rows
    _check_no_leftovers(before, tmp_path)
    pids = {p.read_text().strip() for p in (tmp_path / "out").glob("pid*")}
    left = {n for n in _shm() - before if n.startswith("cuda.shm.") or any(f"torch_{pid}_" in n for pid in pids)}
    assert not left, left


@pytest.mark.two_gpus
def test_auto_on_two_gpus_measures_reads_and_says_why(tmp_path: Path) -> None:
    skip_unless_enough_gpus()
    reports = _run(tmp_path, {"accelerator": "gpu", "devices": TEST_GPUS, "policy": "auto", "budget": _half_the_rows_over(TEST_GPUS),
                              "num_nodes_graph": GPU_GRAPH_NODES})  # fmt: skip
    assert len({(r["policy"], r["digest"]) for r in reports}) == 1  # every rank decided alike
    note = reports[0]["note"]
    assert "expected" in note and "GB/s local" in note and "peer" in note and "host" in note, note
