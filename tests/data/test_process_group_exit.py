"""A gloo process group is destroyed before the interpreter's teardown (``data/process_group_exit.py``): left to it, a
finished 2-rank gloo fit now and then ended with ``terminate called without an active exception`` (SIGABRT)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_RANK = textwrap.dedent(
    """
    import atexit, sys
    import torch.distributed as dist
    sys.path.insert(0, {root!r})
    atexit.register(lambda: print("AT EXIT: group alive =", dist.is_initialized(), flush=True))  # runs last (LIFO)
    dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
    {call}
    dist.all_reduce(__import__("torch").ones(3))
    """
)


def _exit_state(tmp_path: Path, call: str) -> str:
    code = _RANK.format(root=str(ROOT), store=tmp_path / f"store-{len(call)}", call=call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("AT EXIT")][0]


def test_the_group_is_destroyed_at_exit_while_the_interpreter_is_whole(tmp_path: Path) -> None:
    registered = "from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit; " \
                 "destroy_process_group_at_exit(); destroy_process_group_at_exit()"  # fmt: skip
    assert _exit_state(tmp_path, registered) == "AT EXIT: group alive = False"
    assert _exit_state(tmp_path, "pass") == "AT EXIT: group alive = True"  # what Lightning leaves for gloo


def test_a_failed_run_leaves_the_group_and_a_sigterm_stop_does_not(tmp_path: Path) -> None:
    """A rank that failed (a peer died) may have a collective of the group open; destroying it would wait for it."""
    base = "from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed; " \
           "destroy_process_group_at_exit(); "  # fmt: skip
    failed = base + "run_failed(RuntimeError('Connection reset by peer'))"
    assert _exit_state(tmp_path, failed) == "AT EXIT: group alive = True"
    stopped = base + "from pytorch_lightning.utilities.exceptions import SIGTERMException; run_failed(SIGTERMException())"
    assert _exit_state(tmp_path, stopped) == "AT EXIT: group alive = False"


@pytest.fixture
def fake_group(monkeypatch):
    """A default group of the given backend as ``torch.distributed`` reports it, and the aborts it receives."""
    import torch.distributed as dist

    from lightning_zerocopy.data import process_group_exit

    monkeypatch.setattr(process_group_exit, "_FAILED", [False])  # this process's own exit stays as it was
    aborts: list[str] = []
    state = {"backend": "nccl", "alive": True}

    def abort() -> None:
        aborts.append(state["backend"])
        state["alive"] = False  # as torch's: the default group is gone afterwards

    monkeypatch.setattr(dist, "is_initialized", lambda: state["alive"])
    monkeypatch.setattr(dist, "get_backend", lambda group=None: state["backend"])
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    return state, aborts


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "gloo"])
def test_a_failed_run_aborts_an_nccl_group_at_once(fake_group, backend: str) -> None:
    """A collective a peer never joins would hold every GPU wait after it (2 x H200, ``ctrl_c``, one time in six)."""
    from lightning_zerocopy.data.process_group_exit import abort_collectives, run_failed

    state, aborts = fake_group
    state["backend"] = backend
    run_failed(KeyboardInterrupt())
    assert aborts == ([] if backend == "gloo" else [backend])
    assert abort_collectives() is False  # once: the group is gone (or gloo)
    assert len(aborts) <= 1


def test_the_agreed_sigterm_stop_aborts_nothing(fake_group) -> None:
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from lightning_zerocopy.data.process_group_exit import run_failed

    state, aborts = fake_group
    run_failed(SIGTERMException())
    assert aborts == [] and state["alive"]


def test_a_second_caller_waits_for_an_abort_under_way(fake_group, monkeypatch) -> None:
    """The watch thread and the main thread may both abort: the main thread's GPU waits come after the abort."""
    import threading
    import time

    import torch.distributed as dist

    from lightning_zerocopy.data.process_group_exit import abort_collectives

    state, aborts = fake_group
    started, finished = threading.Event(), []

    def slow_abort() -> None:
        started.set()
        time.sleep(0.3)
        aborts.append("nccl")
        state["alive"] = False
        finished.append(time.monotonic())

    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", slow_abort)
    first = threading.Thread(target=abort_collectives)
    first.start()
    started.wait(5)
    assert abort_collectives() is False
    assert finished  # it returned only once the first abort had ended (and did not abort a second time, below)
    first.join(5)
    assert aborts == ["nccl"]


_UNMATCHED = textwrap.dedent(
    """
    import os, sys, time, torch
    import torch.distributed as dist
    sys.path.insert(0, {root!r})
    from lightning_zerocopy.data.process_group_exit import run_failed
    rank = int(sys.argv[1])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://{store}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)  # both ranks: the communicator is up
    torch.cuda.synchronize()
    if rank == 0:
        dist.all_reduce(x)  # one more that rank 1 never joins (Ctrl-C reached it a step earlier)
        t0 = time.monotonic()
        run_failed(KeyboardInterrupt())
        torch.cuda.synchronize()  # the DataModule's release of its pinned memory waits like this
        print(f"RANK0 synchronized {{time.monotonic() - t0:.2f}} s after the failure", flush=True)
    else:
        time.sleep(3)  # still alive while rank 0 waits on it
        run_failed(KeyboardInterrupt())
    """
)


@pytest.mark.two_gpus
def test_a_collective_a_peer_never_joins_does_not_hold_the_gpu_after_a_failure(tmp_path: Path) -> None:
    """Without the abort rank 0's synchronize waits for ever (and so does Lightning's exit-time destroy)."""
    code = _UNMATCHED.format(root=str(ROOT), store=tmp_path / "store")
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]  # fmt: skip
    try:
        outputs = [rank.communicate(timeout=90)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        pytest.fail(f"a rank still waited 90 s after the failure: {[r.communicate()[0][-2000:] for r in ranks]}")
    assert [r.returncode for r in ranks] == [0, 0], outputs
    assert "RANK0 synchronized" in outputs[0], outputs
