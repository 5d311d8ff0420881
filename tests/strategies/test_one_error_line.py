"""A rank that dies is named in one ``error:`` line of the job, however many ranks of its machine survive it (issue 42:
four ranks on four GPUs wrote three, one per survivor). CPU ranks (gloo) that only watch each other
(``tests/scripts/watching_ranks_script.py``), started as ``torchrun`` starts them, their output in one file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, wait_process_gone

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "watching_ranks_script.py"
RANKS = 4


def _start_ranks(tmp_path: Path, how: str, log: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(RANKS), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    for key in ("NODE_RANK", "GLOBAL_RANK", "LZC_LAUNCHER_PID", "LZC_ERROR_LINE"):
        env.pop(key, None)
    with open(log, "ab") as out:  # every rank appends to the one file, as ranks share a terminal
        return [subprocess.Popen([sys.executable, str(SCRIPT), how, str(tmp_path)], stdout=out, stderr=out,
                                 env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), cwd=tmp_path)
                for r in range(RANKS)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "victim"),
    [("mapped", 1), ("mapped", 0), ("waiting", 1), ("collectives", 2), ("stuck", 1)],
    ids=["mapped-kill1", "mapped-kill0", "waiting-kill1", "collectives-kill2", "stuck-kill1"],
)
def test_a_killed_rank_is_named_in_one_error_line(tmp_path: Path, how: str, victim: int) -> None:
    """``mapped``: the clique cache's case (every survivor ends from its watch at once); ``waiting`` and
    ``collectives``: the survivors end through their exception path and the command; ``stuck``: through the watch's
    grace; ``kill0``: the rank that held the process group's store is the one killed."""
    log = tmp_path / "job.log"
    procs = _start_ranks(tmp_path, how, log)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in range(RANKS)):
            assert all(p.poll() is None for p in procs), log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the ranks did not meet within 120 s"
            time.sleep(0.05)
        time.sleep(0.3)  # every watch has polled its peers once
        os.kill(procs[victim].pid, signal.SIGKILL)
        start = time.monotonic()
    except BaseException:
        _kill_rest(procs)
        raise
    _end_all(procs, 30)
    took = time.monotonic() - start
    output = log.read_text()
    survivors = [r for r in range(RANKS) if r != victim]
    assert [procs[r].returncode for r in survivors] == [1] * len(survivors), output[-4000:]
    assert took < 15, (took, output[-4000:])
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-4000:]
    assert errors[0].startswith(f"error: rank {victim} (pid {procs[victim].pid} on "), output[-4000:]
    assert "Traceback" not in output, output[-4000:]


@pytest.mark.slow
def test_a_rank_failing_on_its_own_is_the_one_that_writes_the_error_line(tmp_path: Path) -> None:
    """Rank 1's pipeline worker died (the GPU case ``kill_worker1``): rank 1's own line names it, and the three ranks
    that stop on its account (and end at once when it exits, their cache reading its shard) write notes. Each wrote
    an ``error:`` line, and rank 1's could name a rank that had ended on its account instead of its worker."""
    log = tmp_path / "job.log"
    procs = _start_ranks(tmp_path, "failing", log)
    _end_all(procs, 150)
    output = log.read_text()
    assert [p.returncode for p in procs] == [1] * RANKS, output[-4000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == ["error: the pipeline worker process (pid 4242) was killed by SIGKILL"], output[-4000:]
    assert "Traceback" not in output, output[-4000:]


@pytest.mark.slow
def test_a_launcher_killed_before_the_rendezvous_is_named_in_one_error_line(tmp_path: Path) -> None:
    """Rank 0, which started the others (Lightning's launcher), killed while they wait for the rendezvous: each of
    them stops (its launch watch), and one writes the error line. Three ranks here: each wrote one."""
    log = tmp_path / "job.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", WORLD_SIZE="3", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    for key in ("NODE_RANK", "GLOBAL_RANK", "RANK", "LOCAL_RANK", "LZC_LAUNCHER_PID", "LZC_ERROR_LINE"):
        env.pop(key, None)
    with open(log, "ab") as out:
        launcher = subprocess.Popen([sys.executable, str(SCRIPT), "launcher", str(tmp_path)], stdout=out, stderr=out,
                                    env=env, cwd=tmp_path)  # fmt: skip
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in range(3)):
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        time.sleep(0.2)
        ranks = [int((tmp_path / f"ready{r}").read_text()) for r in (1, 2)]
        launcher.kill()
        launcher.wait()
        assert all(wait_process_gone(pid, 30) for pid in ranks), log.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    output = log.read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-4000:]
    assert errors[0].startswith(f"error: rank 0 (pid {launcher.pid} on ") and "was starting" in errors[0], output


def _end_all(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for each rank to end (raising if one does not), killing whatever is left."""
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        _kill_rest(procs)


def _kill_rest(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
