"""worker_sm_percent="auto" on a GPU: AutoShare moves up the ladder when the build does not fit in the step, times
steps with CUDA events without synchronizing, and closes the other workers once it has chosen; and through the real
command under MPS, a fit chooses a share and says which."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.pipeline.share_auto import AutoShare
from lightning_zerocopy.pipeline import mps
from lightning_zerocopy.pipeline.share_choice import ShareCalibrator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class _Client:
    def __init__(self, percent: int, standby: bool) -> None:
        self.percent, self.standby, self.closed = percent, standby, False

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def _steps(auto: AutoShare, build_ms: dict, count: int, step_ms: float = 4.0) -> None:
    for _ in range(count):
        auto.step_started()
        torch.cuda._sleep(int(step_ms * 2e6))  # GPU work of about step_ms at 2 GHz (longer at lower clocks)
        auto.step_ended(build_ms[auto.calibrator.current] / 1e3)
    torch.cuda.synchronize()


@pytest.mark.cuda
def test_auto_share_moves_up_until_the_build_fits_then_closes_the_others() -> None:
    started = []

    def start(percent, standby):
        started.append(_Client(percent, standby))
        return started[-1]

    auto = AutoShare(start, torch.device("cuda", 0), ShareCalibrator(warmup=1, steps=3))
    assert [(c.percent, c.standby) for c in started] == [(10, False), (20, True), (30, True)]
    assert auto.active.percent == 10
    # a step of >= 4 ms of GPU time; builds of 50 ms under 10 %, 1 ms under 20 %: 20 % is chosen
    for _ in range(40):
        _steps(auto, {10: 50.0, 20: 1.0, 30: 1.0}, 1)
        if auto.calibrator.done:
            break
    assert auto.calibrator.done and auto.calibrator.choice.percent == 20 and auto.active.percent == 20
    assert [c.closed for c in started] == [True, False, True]
    auto.close()
    assert started[1].closed


@pytest.mark.cuda
def test_auto_share_in_the_recipe_chooses_a_share_under_mps(tmp_path: Path) -> None:
    if shutil.which(mps.CONTROL_BINARY) is None:
        pytest.fail(f"{mps.CONTROL_BINARY} is not on PATH on this GPU machine")
    recipe = (ROOT / "recipes" / "gpu_zerocopy.yaml").read_text().replace("worker_sm_percent: 10", "worker_sm_percent: auto")
    config = tmp_path / "auto.yaml"
    config.write_text(recipe)
    env = {k: v for k, v in os.environ.items() if k not in (mps.ROOT_ENV, mps.PIPE_ENV, mps.LOG_ENV, mps.PERCENT_ENV)}
    # this checkout first, then the caller's PYTHONPATH (on the GPU machine jsonargparse comes from it)
    env.update(LIGHTNING_ZEROCOPY_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    # three shares x (10 warm-up + 40 measured steps) = up to 150 steps, and events are read a few steps late
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(config), "--trainer.max_steps=400",
         "--data.init_args.dataset.init_args.num_nodes=400000", "--trainer.limit_val_batches=2",
         f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    line = next((l for l in text.splitlines() if "PipelineCallback(worker_sm_percent='auto'): worker share" in l), None)
    assert line is not None, text[-5000:]
    print(line)  # the figures: the chosen share, its build time and the step time
    # the launcher's supervisor stops the daemon after the command exits: give it the seconds that takes
    deadline = time.monotonic() + 30
    while mps.mps_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not mps.mps_processes(), f"MPS processes left 30 s after the run: {mps.mps_processes()}"
