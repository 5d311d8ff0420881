"""A checkpoint saved mid-epoch on 1 (2) gloo ranks, resumed on 2 (1): every seed of the interrupted epoch is
trained exactly once, and the following epoch is the new world's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "resume_ddp_script.py"


def _fit(tmp_path: Path, name: str, devices: int, max_epochs: int, ckpt: Path | None = None) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LOCAL_RANK", None)
    args = [sys.executable, str(SCRIPT), str(out), str(tmp_path / "cache"), str(devices), str(max_epochs)]
    proc = subprocess.run(args + ([str(ckpt)] if ckpt else []), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "batch plan changed" not in proc.stderr
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after", "epoch_step"), [(1, 2, 6), (2, 1, 4)])
def test_resume_on_another_world_size_trains_each_seed_of_the_epoch_once(
    tmp_path: Path, before: int, after: int, epoch_step: int
) -> None:
    first = _fit(tmp_path, "first", before, max_epochs=2)
    per_epoch = first[0]["steps_per_epoch"]
    step = per_epoch + epoch_step  # epoch 1, after `epoch_step` batches
    ckpt = tmp_path / "first" / "ckpt" / f"step={step}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(ckpt.parent))
    resumed = _fit(tmp_path, "resumed", after, max_epochs=3, ckpt=ckpt)

    epoch_seeds = Counter(s for r in first for e, _, _, seeds in r["batches"] if e == 1 for s in seeds)
    trained_before = [s for r in first for e, i, _, seeds in r["batches"] if e == 1 and i < epoch_step for s in seeds]
    trained_after = [s for r in resumed for e, _, _, seeds in r["batches"] if e == 1 for s in seeds]
    counts = Counter(trained_before + trained_after)
    assert set(counts) == set(epoch_seeds)  # nothing skipped ...
    assert max(counts.values()) == 1  # ... nothing twice
    # the resumed run's global steps continue from the checkpoint; epoch 1 ends where the new plan's epochs end
    epoch1 = [b for b in resumed[0]["batches"] if b[0] == 1]
    assert epoch1[0][2] == step and epoch1[-1][1] == resumed[0]["steps_per_epoch"] - 1
    # epoch 2 is the new world's own: every training seed once (up to the wrap-around padding)
    epoch2 = Counter(s for r in resumed for e, _, _, seeds in r["batches"] if e == 2 for s in seeds)
    assert set(epoch2) == set(resumed[0]["train_idx"])
