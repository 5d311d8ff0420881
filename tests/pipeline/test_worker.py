"""The worker-process pipeline on CPU (slots in shared host memory): same batches, protocol, faults.

Every test is bounded: the pipeline's own waits raise, subprocesses run under timeouts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from helpers import kill_if_running, process_gone, read_ready_line, sigint_at_default, wait_process_gone
from helpers.pipeline_fakes import FakeSource, TwoStageSource
from helpers.slow_exit import exit_slowly, slow_exit_unavailable
from torch_geometric.data import Data

from lightning_zerocopy.pipeline import PipelineError, start_pipeline

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _assert_same(a: Data, b: Data) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in b.keys():
        if isinstance(b[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def _reference(src: FakeSource, epoch: int, step: int) -> Data:
    return src.build_batch(src.plan(epoch, step))


@pytest.fixture(scope="module")
def worker():
    """One worker process shared by the protocol tests (spawning one costs seconds)."""
    client = start_pipeline("worker", depth=2, timeout=30)
    yield client
    client.close()
    assert wait_process_gone(client.transport.pid, 5)


@pytest.mark.parametrize("use_out", [True, False])
def test_worker_and_in_process_yield_the_batches_of_build_batch(worker, use_out):
    """The pipelines run the source's own plan + build_batch: bitwise the same batches, over epochs and a
    batch that outgrows its slot."""
    src = FakeSource(steps=7, huge_at=4, use_out=use_out, seed=3)
    stage = f"train-{use_out}"
    worker.register(stage, src)
    thread = start_pipeline("in_process", depth=2, timeout=30)
    thread.register(stage, src)
    try:
        for epoch in range(2):
            for client in (worker, thread):
                got = list_batches = []
                for step, batch in enumerate(client.iterate(stage, epoch)):
                    _assert_same(batch, _reference(src, epoch, step))
                    list_batches.append(step)
                assert got == list(range(7))
        assert worker.stats.grows >= 1 and thread.stats.grows >= 1
    finally:
        thread.close()


@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_three_stages_sample_the_next_batch_while_gathering_this_one(mode):
    """A two-stage source whose gather of step s only completes once the sample of step s + 1 runs ahead on
    another thread: the producer samples t + 2 while it gathers t + 1 (the trainer holds t), over epochs,
    a grown slot and a mid-epoch start; the batches are build_batch's."""
    src = TwoStageSource(steps=6, huge_at=3, seed=8, require_overlap=True)
    client = start_pipeline(mode, depth=2, timeout=30)
    client.register("t", src)
    try:
        for epoch, start in ((0, 0), (1, 0), (2, 2)):
            steps = []
            for step, batch in enumerate(client.iterate("t", epoch, start=start), start=start):
                _assert_same(batch, src.reference(epoch, step))
                steps.append(step)
            assert steps == list(range(start, 6))
        assert client.stats.grows >= 1
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_without_lookahead_a_two_stage_source_is_built_in_one_call(mode):
    src = TwoStageSource(steps=4, seed=9, require_overlap=True, overlap_wait=0.2)
    client = start_pipeline(mode, depth=2, timeout=30, lookahead=False)
    client.register("t", src)
    try:  # build_batch runs sample and gather on one thread, so the overlap probe cannot be satisfied
        with pytest.raises(PipelineError, match="sampled on the gathering thread"):
            next(iter(client.iterate("t", 0)))
    finally:
        client.close()


def test_held_slot_is_not_overwritten_until_the_next_batch_is_asked_for(worker):
    src = FakeSource(steps=6, seed=5)
    worker.register("hold", src)
    it = worker.iterate("hold", 0)
    first = next(it)
    snapshot = {k: first[k].clone() for k in ("x", "n_id", "edge_index")}
    time.sleep(0.5)  # the worker fills the other slot, then has to wait for this one
    for key, value in snapshot.items():
        assert torch.equal(first[key], value), key
    second = next(it)
    _assert_same(second, _reference(src, 0, 1))
    assert second.x.data_ptr() != first.x.data_ptr()  # ping-pong: the other slot
    it.close()


def test_interleaved_stages_and_abandoned_iterations(worker):
    """Validation interrupts a training epoch (as val_check_interval does); a loader left after two batches
    (the sanity check) does not disturb the next iteration."""
    train, val = FakeSource(steps=5, seed=11), FakeSource(steps=3, seed=12, batch_size=8)
    worker.register("t", train)
    worker.register("v", val)
    sanity = worker.iterate("v", 0)
    for step, batch in zip(range(2), sanity):
        _assert_same(batch, _reference(val, 0, step))
    del sanity
    it = worker.iterate("t", 1)
    for step in range(2):
        _assert_same(next(it), _reference(train, 1, step))
    for step, batch in enumerate(worker.iterate("v", 1)):
        _assert_same(batch, _reference(val, 1, step))
    for step in range(2, 5):
        _assert_same(next(it), _reference(train, 1, step))
    with pytest.raises(StopIteration):
        next(it)
    # resume in the middle of an epoch
    for step, batch in enumerate(worker.iterate("t", 2, start=3), start=3):
        _assert_same(batch, _reference(train, 2, step))


def test_builder_error_is_raised_in_the_trainer_with_its_traceback(worker):
    worker.register("bad", FakeSource(steps=4, fail_at=2))
    it = worker.iterate("bad", 0)
    next(it), next(it)
    with pytest.raises(PipelineError, match=r"(?s)bad batch 2 of epoch 0.*fake builder failure at step 2"):
        next(it)
    # the worker survives a builder error and serves the next iteration
    worker.register("good", FakeSource(steps=2))
    assert len(list(worker.iterate("good", 0))) == 2


def test_depth_one_still_works(worker):
    client = start_pipeline("in_process", depth=1, timeout=30)
    src = FakeSource(steps=4)
    client.register("train", src)
    try:
        for step, batch in enumerate(client.iterate("train", 0)):
            _assert_same(batch, _reference(src, 0, step))
    finally:
        client.close()


def test_sigkill_of_the_worker_mid_epoch_raises_a_clear_error_quickly():
    client = start_pipeline("worker", depth=2, timeout=60)
    try:
        client.register("train", FakeSource(steps=50, delay=0.05))
        it = client.iterate("train", 0)
        next(it), next(it)
        os.kill(client.transport.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(PipelineError, match=r"was killed by SIGKILL while the trainer waited for train batch"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 10
    finally:
        client.close()


@contextlib.contextmanager
def _slowly_exiting_worker(seconds: float) -> Iterator[tuple[Any, Any]]:
    """A trainer's end of a worker that closes its pipe and exits over ``seconds`` (its main thread ends first, a
    SIGKILL ends the rest: :mod:`helpers.slow_exit`), with its process."""
    import multiprocessing

    from lightning_zerocopy.pipeline.worker import WorkerTransport

    reason = slow_exit_unavailable()
    if reason:
        pytest.skip(reason)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=exit_slowly, args=(seconds, (parent, child)))
    process.start()
    child.close()
    transport = WorkerTransport.__new__(WorkerTransport)
    transport.process, transport._conn, transport._started = process, parent, True
    try:
        yield transport, process
    finally:
        process.kill()
        process.join()
        parent.close()


def test_a_worker_still_exiting_when_its_pipe_closes_is_named_by_how_it_died():
    """A worker's pipe closes as it starts exiting; under MPS, a SIGKILLed worker took more than the 1 s the
    trainer waited to end (2 x H200, 2026-11-29: ``kill_worker1``), and the error said it closed its pipe but still
    ran. The trainer now waits while the worker exits, and names the signal."""
    with _slowly_exiting_worker(2.5) as (transport, _):
        assert transport.recv(timeout=30) is None
        with pytest.raises(PipelineError, match=r"was killed by SIGKILL while the trainer waited for a batch"):
            transport.check_alive("a batch")


def test_a_worker_killed_by_a_signal_is_named_as_soon_as_its_exit_begins(monkeypatch):
    """The signal is read from the exiting process's exit status (Linux keeps it from the start of the exit), so the
    trainer names the SIGKILL at once, not after the worker's CUDA context has closed: in a two-GPU run that wait came
    before the error note its peers act on."""
    from lightning_zerocopy.pipeline import worker
    from lightning_zerocopy.process_state import process_dying

    monkeypatch.setattr(worker, "exit_signal", lambda pid: signal.SIGKILL if process_dying(pid) else None)
    with _slowly_exiting_worker(5.0) as (transport, process):
        start = time.monotonic()
        assert transport.recv(timeout=30) is None
        with pytest.raises(PipelineError, match=r"was killed by SIGKILL while the trainer waited for a batch"):
            transport.check_alive("a batch")
        assert time.monotonic() - start < 2.0 and process.is_alive()  # named while it still exits


def test_a_worker_that_cannot_stop_is_ended_within_twice_the_close_timeout():
    """A run stopping on an exception gives its worker 1 s (PipelineCallback's EXCEPTION_CLOSE_S): a worker held
    behind a stream that never drains never stops, and waiting 1 + 2 s, then killing, ate into the job's 10 s."""
    client = start_pipeline("worker", depth=2, timeout=60)
    pid = client.transport.pid
    client.register("train", FakeSource(steps=5, delay=60.0))  # the build holds the worker for a minute
    client.iterate("train", 0)
    time.sleep(0.5)
    start = time.monotonic()
    client.close(timeout=0.5)
    took = time.monotonic() - start
    assert process_gone(pid)
    assert took < 2.0, f"closing took {took:.2f} s"


_TRAINER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{here!r}, {tests!r}]
    from helpers.pipeline_fakes import FakeSource
    from lightning_zerocopy.pipeline import start_pipeline

    if __name__ == "__main__":
        client = start_pipeline("worker", depth=2, timeout=60)
        client.register("train", FakeSource(steps=10_000, delay=0.01, features=256, batch_size=256))
        it = client.iterate("train", 0)
        next(it)
        print("READY", client.transport.pid, flush=True)
        for batch in it:
            time.sleep(0.01)
    """
)


def _start_trainer(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER_SCRIPT.format(here=str(HERE), tests=str(HERE.parent)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=sigint_at_default,
    )
    line = read_ready_line(proc, timeout=60)
    if line is None:
        proc.kill()
        pytest.fail(f"trainer script did not start: {proc.stderr.read()}")
    return proc, int(line.split()[1])


def _shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_worker_never_outlives_the_trainer(tmp_path, sig):
    """Ctrl-C (SIGINT) or SIGKILL of the trainer: the worker exits, nothing is left in /dev/shm."""
    before = _shm_entries()
    proc, worker_pid = _start_trainer(tmp_path)
    try:
        assert not process_gone(worker_pid)
        proc.send_signal(sig)
        proc.wait(timeout=60)  # generous: CI machines can be loaded
        assert wait_process_gone(worker_pid, 5), f"worker {worker_pid} outlived the trainer ({sig.name})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        kill_if_running(worker_pid)
    # names a leak of ours would carry (torch's file_system strategy, our segments); other processes' are ignored
    leaked = {n for n in _shm_entries() - before if str(proc.pid) in n or str(worker_pid) in n}
    assert leaked == set()


_SLOW_TEARDOWN = """
import time
class _SlowTeardown:
    def __del__(self, sleep=time.sleep):
        sleep(60)
_slow_teardown = _SlowTeardown()  # deleted while the interpreter finalizes, when daemon threads can no longer run
"""


def _worker_site(tmp_path: Path, code: str) -> dict[str, str]:
    """Environment for a worker whose interpreter runs ``code`` at startup (``sitecustomize``)."""
    (tmp_path / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_worker_exits_without_the_interpreter_teardown(tmp_path):
    """Once its trainer's end of the pipe closes, the worker exits at once: on a loaded machine the interpreter's
    teardown (with torch loaded) kept an orphaned worker alive for 5-15 s, and its parent watchdog, a daemon
    thread, cannot act during the teardown. Here the teardown is made to take a minute."""
    client = start_pipeline("worker", depth=2, timeout=60, worker_env=_worker_site(tmp_path, _SLOW_TEARDOWN))
    pid = client.transport.pid
    try:
        client.register("t", FakeSource(steps=2))  # the worker is up and serving
        client.transport._conn.close()  # as when the trainer dies
        assert wait_process_gone(pid, 20), f"worker {pid} is still in its interpreter's teardown"
    finally:
        kill_if_running(pid)
        client.transport.process.join(5)


def test_a_slow_worker_start_does_not_count_as_a_stuck_producer(tmp_path):
    """The batch timeout measures the producer; a worker whose interpreter takes longer than that to start (as
    under load, where importing torch alone took over 30 s) is waited for."""
    slow_start = "import torch_geometric.data, time\ntime.sleep(8)\n"  # PyG preloaded: only the start is slow
    client = start_pipeline("worker", depth=2, timeout=4, worker_env=_worker_site(tmp_path, slow_start))
    try:
        client.register("t", FakeSource(steps=3))
        assert len(list(client.iterate("t", 0))) == 3
    finally:
        client.close()


class _ScriptedChannel:
    """A producer channel that hands out a fixed list of commands and records what the producer sends."""

    def __init__(self, commands: list[tuple]) -> None:
        self.commands, self.sent = list(commands), []

    def send(self, msg: tuple) -> None:
        self.sent.append(msg)

    def recv(self) -> tuple:
        return self.commands.pop(0)

    def poll(self) -> bool:
        return False


def test_producer_forgets_the_slots_as_soon_as_it_stops():
    """The slots are the trainer's (sent over CUDA IPC in a worker): the producer drops them first thing when its
    loop ends, before it closes sources and caches (seconds, during which the trainer may terminate the worker)."""
    import weakref

    from lightning_zerocopy.pipeline.producer import Producer

    slot = {"x": torch.zeros(4, 3)}
    alive = weakref.ref(slot["x"])
    producer = Producer(_ScriptedChannel([("slots", "t", None, [slot]), ("stop",)]))
    del slot
    assert alive() is not None  # the commands (and the producer, once handled) hold it
    producer.run()
    assert producer.stages["t"].buffers == [] and not producer.stages["t"].free
    assert alive() is None, "the producer still holds a slot after its loop ended"


def test_a_sigterm_leaves_the_worker_to_its_trainer() -> None:
    """A scheduler pre-empting the job signals every process of it: the worker keeps building (the trainer still
    takes batches until the step it saves has ended), and the trainer's close ends it at once."""
    client = start_pipeline("worker", depth=2, timeout=60)
    pid = client.transport.pid
    try:
        client.register("t", FakeSource(steps=4))
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        assert not process_gone(pid) and len(list(client.iterate("t", 0))) == 4
        start = time.monotonic()
        client.close()
        assert wait_process_gone(pid, 10) and time.monotonic() - start < 10
    finally:
        kill_if_running(pid)
