"""What the command writes, checked before it works (issue 38): a ``default_root_dir`` that is a file or cannot be
created, a predictions file whose name is a folder, a ``--ckpt_path`` cut short or of another model: each one line
(exit status 2) before data is built or anything is predicted, instead of a traceback at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("--data.init_args.dataset.init_args.num_nodes=1500", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
         "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", "--trainer.logger=false")  # fmt: skip


def _run(tmp_path: Path, subcommand: str, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LIGHTNING_ZEROCOPY_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "lightning_zerocopy", subcommand, "--config", str(ROOT / "recipes" / "quickstart.yaml"),
            *SMALL, f"--trainer.default_root_dir={tmp_path / 'run'}", *overrides]  # fmt: skip
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("where", ["a file", "not creatable"])
def test_a_default_root_dir_that_cannot_hold_the_run_is_one_line(tmp_path: Path, where: str) -> None:
    if where == "a file":
        target = tmp_path / "afile"
        target.write_text("x")
        expected = f"error: trainer.default_root_dir {target} is a file, not a folder"
    else:
        target = Path("/proc/lzc-no-such-folder")
        expected = f"error: trainer.default_root_dir {target} cannot be written"
    line = _error(_run(tmp_path, "fit", f"--trainer.default_root_dir={target}"))
    assert line.startswith(expected), line
    assert not (tmp_path / "cache").exists()  # refused before any data was built


def test_resume_with_a_changed_model_or_a_damaged_checkpoint_is_one_line(tmp_path: Path) -> None:
    first = _run(tmp_path, "fit")
    assert first.returncode == 0, first.stderr[-3000:]
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    line = _error(_run(tmp_path, "fit", "--ckpt_path=last", "--model.init_args.hidden_channels=32"))
    assert f"--ckpt_path {last} does not fit the model: net.convs.0.lin_l.weight is [64, 32] in the checkpoint but " \
           "[32, 32] in the model (model.init_args.hidden_channels is 32, 64 in the checkpoint)" in line, line
    line = _error(_run(tmp_path, "fit", "--ckpt_path=last", "--data.init_args.dataset.init_args.num_features=16"))
    assert "data.num_features (model.init_args.in_channels) is 16, 32 in the checkpoint" in line, line

    (tmp_path / "run" / "predictions.npz").mkdir()  # a folder where predict writes its file: refused up front
    line = _error(_run(tmp_path, "predict", "--ckpt_path=last"))
    assert f"{tmp_path / 'run' / 'predictions.npz'} is a folder" in line, line
    assert not list((tmp_path / "run").glob("*.tmp.npz"))

    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # cut short
    for path in ("last", str(last)):
        line = _error(_run(tmp_path, "fit", f"--ckpt_path={path}"))
        assert line.startswith(f"error: --ckpt_path {last} is damaged and cannot be read ("), line
