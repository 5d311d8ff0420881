"""How a one-GPU run of ``recipes/gpu_zerocopy.yaml`` (the pipeline worker under MPS) ends when it is pre-empted or
killed (issue 38): SIGTERM to the whole job saves the current step and exits with status 143, every process of the
job (trainer, worker, MPS daemon and its supervisor) gone within 10 s and nothing left in /dev/shm, and ``fit
--ckpt_path last`` finishes the epoch with every seed trained once; a SIGABRT or SIGKILL of the command leaves no MPS
daemon either (its supervisor stops it). The CPU counterparts: ``tests/test_cli_preemption.py``."""

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

import pytest

from helpers import load_test_module
from helpers.cli_jobs import command_env
from helpers.job_log import output_of, process_report, start_logged
from lightning_zerocopy.process_state import process_alive, process_dying

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 10.0
_two = load_test_module(__file__, "test_faults_two_gpus")  # _shm


def _start(tmp_path: Path, markers: Path, *overrides: str) -> subprocess.Popen:
    markers.mkdir(exist_ok=True)
    env = command_env(tmp_path / "cache", markers, without_mps=True)
    args = [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(ROOT / "recipes" / "gpu_zerocopy.yaml"),
            "--data.init_args.dataset.init_args.num_nodes=200000", "--data.init_args.batch_size=256",
            "--trainer.strategy.init_args.cache_budget=16MiB", "--trainer.strategy.init_args.presample_batches=8",
            "--trainer.limit_val_batches=0", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            "--trainer.callbacks+=helpers.cli_markers.RecordTrainedSeeds", *overrides]  # fmt: skip
    return start_logged(args, markers.parent / f"{markers.name}.log", cwd=tmp_path, env=env, start_new_session=True)


def _until_training(proc: subprocess.Popen, markers: Path) -> dict[str, int]:
    deadline = time.monotonic() + 300
    while not (markers / "training0").exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before training: {output_of(proc)[-5000:]}")
        assert time.monotonic() < deadline, "no training within 300 s"
        time.sleep(0.1)
    info = json.loads((markers / "processes0.json").read_text())
    found = {"rank0": info["pid"], "worker0": info["worker_pid"], "mps_daemon": info["mps_daemon_pid"]}
    state = Path(info["mps_root"] or "/nonexistent") / "state.json"
    if state.exists():
        found["mps_supervisor"] = json.loads(state.read_text()).get("supervisor_pid")
    assert all(found.values()), f"the worker does not run under MPS: {found}"
    return found


def _ended_within(processes: dict[str, int], proc: subprocess.Popen, start: float) -> str:
    """Every process of the job gone or dying (:func:`process_alive`: a SIGABRT's core dump of the trainer, which
    the kernel writes before the process ends, can take minutes with a CUDA context) within :data:`BOUND_S`."""
    ended: dict[str, float] = {}  # role -> seconds after the signal when it was first seen gone
    while len(ended) < len(processes) and time.monotonic() - start < BOUND_S:
        for role, pid in processes.items():
            if role not in ended and not process_alive(pid):
                ended[role] = round(time.monotonic() - start, 2)
        time.sleep(0.05)
    print(f"ended after the signal (s): {ended}; dying, not yet gone: "
          f"{[role for role, pid in processes.items() if process_dying(pid)]}")  # fmt: skip
    left = {role: pid for role, pid in processes.items() if role not in ended and process_alive(pid)}
    report = "\n".join(process_report(pid) for pid in left.values())  # what each straggler waits in
    try:
        output = output_of(proc, timeout=60)  # a core dump of the trainer may still be written
    except subprocess.TimeoutExpired:
        print(f"the command still ran {time.monotonic() - start:.0f} s after the signal (dying: "
              f"{process_dying(proc.pid)}): killed")  # fmt: skip
        os.killpg(proc.pid, signal.SIGKILL)
        output = output_of(proc)
    print(f"the command ended {time.monotonic() - start:.1f} s after the signal")
    for pid in left.values():
        with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {BOUND_S} s after the signal: {left}\n{report}\n{output[-5000:]}"
    return output


def _seeds(markers: Path) -> list[tuple[int, int, list[int]]]:
    path = markers / "seeds0.jsonl"
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.cuda
def test_sigterm_with_the_worker_under_mps_saves_the_step_and_the_resume_trains_every_seed_once(tmp_path: Path) -> None:
    before = _two._shm()
    first = tmp_path / "first"
    proc = _start(tmp_path, first, "--trainer.max_epochs=50", "--trainer.callbacks+=helpers.cli_markers.MarkTraining")
    processes = _until_training(proc, first)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)  # as SLURM: every process of the job
    output = _ended_within(processes, proc, start)
    assert proc.returncode == 143, output[-5000:]
    lines = [line for line in output.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and "Traceback" not in output, output[-5000:]
    found = re.search(r"is saved in (\S+);", lines[0])
    assert found and Path(found.group(1)).is_file(), lines[0]
    leftovers = {n for n in _two._shm() - before if n.startswith(("cuda.shm.", "torch_", "lzc-"))}
    assert not leftovers, leftovers

    trained = _seeds(first)
    epoch = max(e for e, _, _ in trained)
    resumed = _start(tmp_path, tmp_path / "resumed", f"--trainer.max_epochs={epoch + 1}", "--ckpt_path=last")
    out = output_of(resumed, timeout=300)
    assert resumed.returncode == 0, out[-5000:]
    train = set(json.loads((tmp_path / "resumed" / "train_idx.json").read_text()))
    before_stop = [s for e, _, seeds in trained if e == epoch for s in seeds]
    after = [s for e, _, seeds in _seeds(tmp_path / "resumed") if e == epoch for s in seeds]
    assert not set(before_stop) & set(after) and set(before_stop) | set(after) == train


@pytest.mark.cuda
@pytest.mark.parametrize("sig", [signal.SIGABRT, signal.SIGKILL], ids=["SIGABRT", "SIGKILL"])
def test_a_killed_command_leaves_no_mps_daemon(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGABRT as a C++ ``std::terminate`` raises it: the trainer calls ``abort()`` itself. A SIGABRT sent from
    outside is another fault: on the GPU image (2 x H200, 2026-11-28) the trainer had a native SIGABRT handler
    installed (its library is printed below), and 70 s after one it had neither ended nor begun a core dump."""
    markers = tmp_path / "markers"
    proc = _start(tmp_path, markers, "--trainer.max_epochs=50", "--trainer.callbacks+=helpers.cli_markers.MarkTraining")
    processes = _until_training(proc, markers)
    handler = json.loads((markers / "processes0.json").read_text())["sigabrt_handler"]
    start = time.monotonic()
    if sig == signal.SIGABRT:
        (markers / "abort0").touch()  # MarkTraining calls abort() at the next batch
    else:
        os.kill(processes["rank0"], sig)
    output = _ended_within(processes, proc, start)  # the daemon and its supervisor among them
    assert proc.returncode < 0, f"exit status {proc.returncode}, not a signal's\n{output[-3000:]}"
    print(f"{sig.name}: trainer, worker, MPS daemon and supervisor gone {time.monotonic() - start:.1f} s after it "
          f"(exit status {proc.returncode}); the trainer's native SIGABRT handler: {handler}")
