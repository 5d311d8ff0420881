"""A pre-empted run (a real SIGTERM, CPU ranks): the command saves the current step as ``last.ckpt``, stops every rank
and the pipeline worker, leaves no shared memory, and exits with status 143 after one line naming the checkpoint;
``fit --ckpt_path last`` then finishes the epoch with every training seed trained once. A second SIGTERM still ends
cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import FAULT_BOUND_S, wait_process_gone
from helpers.cli_jobs import command_env, finish, wait_for_file

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("--data.init_args.dataset.init_args.num_nodes=3000", "--data.init_args.batch_size=64",
         "--trainer.logger=false", "--trainer.enable_progress_bar=false",
         "--trainer.callbacks+=helpers.cli_markers.RecordTrainedSeeds")  # fmt: skip
WORKER = '--trainer.callbacks+={"class_path": "lightning_zerocopy.callbacks.PipelineCallback", "init_args": {"mode": "worker"}}'


def _fit(tmp_path: Path, markers: Path, *overrides: str) -> subprocess.Popen:
    markers.mkdir(exist_ok=True)
    env = command_env(tmp_path / "cache", markers, OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"),
            *SMALL, *overrides]  # fmt: skip
    return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _trained_rank(markers: Path, rank: int) -> list[tuple[int, int, list[int]]]:
    """``(epoch, batch_idx, seeds)`` of every training batch rank ``rank`` finished (``RecordTrainedSeeds``)."""
    path = markers / f"seeds{rank}.jsonl"
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def _trained(markers: Path, ranks: int) -> list[tuple[int, int, list[int]]]:
    return [batch for rank in range(ranks) for batch in _trained_rank(markers, rank)]


def _segments(pids: "list[int]") -> set[str]:
    """The segments in /dev/shm that processes of this job created (other jobs may share the machine)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if any(n.startswith(f"lzc-{pid}-") for pid in pids)}


def _preempt(tmp_path: Path, ranks: int, overrides: tuple[str, ...], whole_group: bool) -> tuple[str, list[int]]:
    """Start a fit, SIGTERM it at the third training step of rank 0, and return its output and processes."""
    markers = tmp_path / "first"
    proc = _fit(tmp_path, markers, "--trainer.max_epochs=50", f"--trainer.devices={ranks}",
                "--trainer.callbacks+=helpers.cli_markers.MarkTraining", *overrides)  # fmt: skip
    for rank in range(ranks):
        wait_for_file(markers / f"training{rank}", proc)
    processes = [json.loads((markers / f"processes{r}.json").read_text()) for r in range(ranks)]
    pids = [p["pid"] for p in processes] + [p["worker_pid"] for p in processes if p["worker_pid"]]
    (os.killpg if whole_group else os.kill)(proc.pid, signal.SIGTERM)
    output = finish(proc, FAULT_BOUND_S * 2)
    assert proc.returncode == 143, output[-4000:]
    assert all(wait_process_gone(pid, FAULT_BOUND_S) for pid in pids), f"processes {pids} outlived the command"
    return output, pids


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "overrides", "whole_group"),
    [(1, (WORKER,), True), (2, ("--trainer.strategy=ddp",), True), (2, ("--trainer.strategy=zerocopy_ddp",), False)],
    ids=["one-rank-worker", "ddp-gloo-job-signalled", "zerocopy_ddp-rank0-signalled"],
)
def test_sigterm_saves_the_step_exits_143_and_the_resume_trains_every_seed_once(
    tmp_path: Path, ranks: int, overrides: tuple[str, ...], whole_group: bool
) -> None:
    """``whole_group``: the scheduler signals every process of the job (SLURM), else only the command (Kubernetes'
    first process): the other rank stops after the same step either way."""
    output, pids = _preempt(tmp_path, ranks, overrides, whole_group)
    lines = [line for line in output.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and "Traceback" not in output, output[-4000:]
    found = re.search(r"is saved in (\S+);", lines[0])
    assert found and Path(found.group(1)).is_file(), lines[0]
    assert not _segments(pids), _segments(pids)
    first = _trained(tmp_path / "first", ranks)
    stopped_epoch = max(e for e, _, _ in first)
    # every rank stopped after the same step
    per_rank = [{(e, b) for e, b, _ in _trained_rank(tmp_path / "first", r)} for r in range(ranks)]
    assert all(p == per_rank[0] for p in per_rank), per_rank

    resumed = _fit(tmp_path, tmp_path / "resumed", f"--trainer.max_epochs={stopped_epoch + 1}",
                   f"--trainer.devices={ranks}", "--ckpt_path=last", *overrides)  # fmt: skip
    out = finish(resumed, 600)
    assert resumed.returncode == 0, out[-4000:]
    train = set(json.loads((tmp_path / "resumed" / "train_idx.json").read_text()))
    before_stop = [s for e, _, seeds in first if e == stopped_epoch for s in seeds]
    after = [s for e, _, seeds in _trained(tmp_path / "resumed", ranks) if e == stopped_epoch for s in seeds]
    assert before_stop and after, (len(before_stop), len(after))
    assert not set(before_stop) & set(after), "a seed trained before the stop was trained again"
    assert set(before_stop) | set(after) == train, "the resumed epoch skipped seeds"


@pytest.mark.slow
def test_a_second_sigterm_still_ends_cleanly(tmp_path: Path) -> None:
    """Two SIGTERMs to every process of a 2-rank job with a worker each, 20 ms apart: status 143, one line, nothing
    left; a checkpoint it names loads (a stop during the write leaves no damaged file)."""
    markers = tmp_path / "first"
    proc = _fit(tmp_path, markers, "--trainer.max_epochs=50", "--trainer.devices=2", "--trainer.strategy=zerocopy_ddp",
                "--trainer.callbacks+=helpers.cli_markers.MarkTraining", WORKER)  # fmt: skip
    for rank in range(2):
        wait_for_file(markers / f"training{rank}", proc)
    processes = [json.loads((markers / f"processes{r}.json").read_text()) for r in range(2)]
    pids = [p["pid"] for p in processes] + [p["worker_pid"] for p in processes if p["worker_pid"]]
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    output = finish(proc, FAULT_BOUND_S * 2)
    assert proc.returncode == 143, output[-4000:]
    assert all(wait_process_gone(pid, FAULT_BOUND_S) for pid in pids), output[-4000:]
    lines = [line for line in output.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1 and "Traceback" not in output, output[-4000:]
    found = re.search(r"is saved in (\S+);", lines[0])
    if found:
        torch.load(found.group(1), map_location="cpu", weights_only=False)
    assert not _segments(pids), _segments(pids)
