"""How a two-GPU run of ``recipes/multi_gpu.yaml`` ends (the command, both ranks, each rank's pipeline worker under
MPS, the clique or replicated cache): after a normal exit, SIGKILL of rank 0, of rank 1 or of rank 1's pipeline
worker, Ctrl-C and SIGTERM of the command (to every process of the job, as a scheduler sends it), every process of
the job ends within 10 s, nothing is left in /dev/shm (torch's and the driver's IPC files, our segments), no MPS
daemon is left on the machine, torch prints no CUDA IPC line, and one line names the cause: the rank or worker that
died, the interrupt, or the pre-emption: one ``error:`` line where a rank or worker died, whatever the number of
ranks (the others write notes).

SIGTERM (issue 39's gate, written for issue 38's pre-emption): the command exits with status 143 after one line
``stopped by SIGTERM...`` naming the checkpoint of the current step, which must exist. A tree without issue 38's
handling ends with status 1 and one ``error:`` line naming SIGTERM; the test accepts that too (and says which it saw),
but never status 0, which a scheduler would record as a finished job.

``LZC_TEST_GPUS=N`` (default 2, :mod:`helpers.test_gpus`) runs the same cases on N ranks, one per GPU (issue 42: 4
and 8 GPUs); the case skips where the machine has fewer GPUs (``REQUIRE_TWO_GPUS=1`` turns that skip into a failure)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from helpers import process_gone
from helpers.cli_jobs import command_env
from helpers.job_log import output_of, process_report, start_logged
from helpers.test_gpus import TEST_GPUS, skip_unless_enough_gpus
from lightning_zerocopy.exit_trace import ENV as EXIT_TRACE_ENV

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 10.0
SHM = Path("/dev/shm")
RANKS = TEST_GPUS


def _shm() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


@pytest.fixture(scope="module")
def graph_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One dataset cache for the module's runs: the 400k-node graph is drawn once, not per fault."""
    return tmp_path_factory.mktemp("graph_cache")


def _start(tmp_path: Path, *overrides: str, cache: Optional[Path] = None) -> subprocess.Popen:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    env = command_env(cache or tmp_path / "cache", markers, without_mps=True)
    env[EXIT_TRACE_ENV] = "4"  # a rank still stopping 4 s after its exception path began prints where it waits
    args = [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(ROOT / "recipes" / "multi_gpu.yaml"),
            f"--trainer.devices={RANKS}", "--data.init_args.dataset.init_args.num_nodes=400000",
            "--trainer.strategy.init_args.cache_budget=16MiB", "--trainer.strategy.init_args.presample_batches=8",
            "--trainer.max_epochs=50", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
            "--trainer.callbacks+=helpers.cli_markers.MarkTraining", *overrides]  # fmt: skip
    return start_logged(args, tmp_path / "job.log", cwd=tmp_path, env=env, start_new_session=True,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip


def _job_processes(markers: Path) -> dict[str, int]:
    """Every process of the job by role: the ranks, their workers, the MPS daemon and its supervisor."""
    found: dict[str, int] = {}
    for rank in range(RANKS):
        info = json.loads((markers / f"processes{rank}.json").read_text())
        found[f"rank{rank}"] = info["pid"]
        if info["worker_pid"]:
            found[f"worker{rank}"] = info["worker_pid"]
        if info["mps_daemon_pid"]:
            found["mps_daemon"] = info["mps_daemon_pid"]
            state = Path(info["mps_root"]) / "state.json"
            if state.exists():
                supervisor = json.loads(state.read_text()).get("supervisor_pid")
                if supervisor:
                    found["mps_supervisor"] = supervisor
    return found


def _mps_now() -> set[int]:
    from lightning_zerocopy.pipeline.mps import mps_processes  # reads /proc only: no CUDA in this process

    return set(mps_processes())


def _check_sigterm(output: str, returncode: int, tmp_path: Path) -> str:
    """Issue 38's pre-emption (status 143, one ``stopped by SIGTERM`` line naming a checkpoint that exists), or a
    tree without it (status 1, one ``error:`` line naming SIGTERM). Returns which one it saw."""
    lines = output.splitlines()
    stopped = [line for line in lines if line.startswith("stopped by SIGTERM")]
    if returncode == 143:
        assert len(stopped) == 1, output[-5000:]
        saved = re.search(r"is saved in (\S+);", stopped[0])
        assert saved is None or (tmp_path / saved.group(1)).is_file() or Path(saved.group(1)).is_file(), stopped[0]
        return "issue 38: exit 143, " + ("checkpoint " + saved.group(1) if saved else stopped[0])
    errors = [line for line in lines if line.startswith("error:")]
    assert returncode == 1 and not stopped, f"exit status {returncode} after SIGTERM\n{output[-5000:]}"
    assert len(errors) == 1 and "SIGTERM" in errors[0], output[-5000:]
    return "before issue 38: exit 1, " + errors[0]


FAULTS = ["none", "kill_rank0", "kill_rank1", "kill_worker1", "sigterm", "ctrl_c"]
#: ``LZC_FAULT_REPEATS=N`` runs every case N times (ids ``<fault>-<k>``): a race shows as a pass and a fail of the
#: same commit (2 x H200, 2026-11-29: ``ctrl_c`` passed in one call and failed in the next)
REPEATS = max(1, int(os.environ.get("LZC_FAULT_REPEATS", "1")))


@pytest.mark.two_gpus
@pytest.mark.parametrize("fault", [pytest.param(f, id=f if REPEATS == 1 else f"{f}-{k}")
                                   for f in FAULTS for k in range(REPEATS)])  # fmt: skip
def test_a_two_gpu_run_ends_cleanly(tmp_path: Path, graph_cache: Path, fault: str) -> None:
    skip_unless_enough_gpus()
    before, mps_before = _shm(), _mps_now()
    proc = _start(tmp_path, *(["--trainer.max_steps=40"] if fault == "none" else []), cache=graph_cache)
    markers = tmp_path / "markers"
    deadline = time.monotonic() + 400
    while not all((markers / f"training{r}").exists() for r in range(RANKS)):
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training: {output_of(proc)[-5000:]}")
        assert time.monotonic() < deadline, "no training within 400 s"
        time.sleep(0.1)
    processes = _job_processes(markers)
    assert all(f"worker{r}" in processes for r in range(RANKS)) and "mps_daemon" in processes, processes
    start = time.monotonic()
    if fault == "kill_rank0":
        os.kill(processes["rank0"], signal.SIGKILL)
    elif fault == "kill_rank1":
        os.kill(processes["rank1"], signal.SIGKILL)
    elif fault == "kill_worker1":
        os.kill(processes["worker1"], signal.SIGKILL)
    elif fault == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    elif fault == "sigterm":
        os.killpg(proc.pid, signal.SIGTERM)  # as SLURM or Kubernetes: every process of the job
    limit = 300 if fault == "none" else BOUND_S  # a normal run first trains its 40 steps
    while not all(process_gone(pid) for pid in processes.values()) and time.monotonic() - start < limit:
        time.sleep(0.05)
    took = time.monotonic() - start
    left = {role: pid for role, pid in processes.items() if not process_gone(pid)}
    report = "\n".join(process_report(pid) for pid in left.values())  # what each straggler waits in
    try:
        output = output_of(proc, timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = output_of(proc)
    for pid in left.values():
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {took:.1f} s after {fault}: {left}\n{report}\n{output[-5000:]}"
    leftovers = {n for n in _shm() - before if n.startswith(("cuda.shm.", "torch_", "lzc-"))}
    assert not leftovers, leftovers
    mps_left = _mps_now() - mps_before  # the job's daemon and its server, whatever their pids
    while mps_left and time.monotonic() - start < limit:
        time.sleep(0.05)
        mps_left = _mps_now() - mps_before
    assert not mps_left, f"MPS processes left {time.monotonic() - start:.1f} s after {fault}: {sorted(mps_left)}"
    assert "CudaIPCTypes" not in output and "shared CUDA tensors released" not in output, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    assert "illegal memory access" not in output, output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    seen = ""
    if fault == "none":
        assert proc.returncode == 0 and not errors, output[-5000:]
    elif fault == "ctrl_c":
        assert proc.returncode == 130, output[-5000:]
        named = [line for line in output.splitlines() if "KeyboardInterrupt" in line or "SIGINT" in line]
        assert len(named) == 1 and not errors, output[-5000:]
    elif fault == "sigterm":
        seen = "; " + _check_sigterm(output, proc.returncode, tmp_path)
    elif fault == "kill_rank1":
        assert proc.returncode == 1 and len(errors) == 1, output[-5000:]
        assert f"rank 1 (pid {processes['rank1']}" in errors[0], output[-5000:]
    elif fault == "kill_rank0":  # (the command's own process: killed, its status is -9)
        assert len(errors) == 1 and f"rank 0 (pid {processes['rank0']}" in errors[0], output[-5000:]
    elif fault == "kill_worker1":  # rank 1's line; the ranks that stop on its account write notes
        assert proc.returncode == 1 and len(errors) == 1, output[-5000:]
        assert f"(pid {processes['worker1']}) was killed by SIGKILL" in errors[0], output[-5000:]
    print(f"{fault} on {RANKS} ranks: every process ended {took:.2f} s after it; exit status {proc.returncode}{seen}")
    if took > BOUND_S / 2:  # a pass near the bound: what the job said, the exit traces included
        print(output[-6000:])
