"""A normal run of the command prints its progress and figures, not Lightning's notices a user must ignore: no
tensorboardX notice, no "💡 Tip" advertisements, no ``LeafSpec`` deprecation, no "The dirpath has changed" on
``test``/``predict`` with a checkpoint, no "No seed found" for a recipe without ``seed_everything``. The filters are targeted: another warning still shows.

And the README's commands (and ``docs/USAGE.md``'s) run as written from a fresh clone: each ``lightning-zerocopy``
command of a shell block starts with ``.venv/bin/`` (what ``scripts/setup_env.sh`` creates), and none names a version
folder (which run is ``version_0`` depends on what ran first; ``--ckpt_path last`` is this recipe's last run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
NOTICES = ("tensorboardX", "💡 Tip", "litlogger", "litmodels", "LeafSpec", "The dirpath has changed", "No seed found")


def _run(args: list[str], tmp_path: Path) -> str:
    env = dict(os.environ, LIGHTNING_ZEROCOPY_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "lightning_zerocopy", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_fit_test_and_predict_print_no_notice_to_ignore(tmp_path: Path) -> None:
    recipe = tmp_path / "quickstart.yaml"  # as a user's recipe may be: without seed_everything
    recipe.write_text("\n".join(line for line in QUICKSTART.read_text().splitlines() if "seed_everything" not in line))
    small = ["--config", str(recipe), "--data.init_args.dataset.init_args.num_nodes=600",
             "--data.init_args.batch_size=64", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
             "--trainer.limit_predict_batches=2", "--trainer.enable_progress_bar=false"]  # fmt: skip
    fit = _run(["fit", *small, "--trainer.max_steps=3", "--trainer.log_every_n_steps=1000"], tmp_path)
    assert "smaller than the logging interval" in fit  # another of Lightning's warnings still shows
    test = _run(["test", *small, "--ckpt_path", "last"], tmp_path)
    assert "test_acc" in test
    predict = _run(["predict", *small, "--ckpt_path", "last"], tmp_path)
    assert "predictions.npz" in predict
    for name, output in (("fit", fit), ("test", test), ("predict", predict)):
        shown = [notice for notice in NOTICES if notice in output]
        assert not shown, f"{name} printed {shown}:\n{output[-3000:]}"


def _shell_commands(readme: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if "lightning-zerocopy" in line or "lightning_zerocopy" in line]


def test_the_readmes_commands_run_from_a_fresh_clone_in_any_order() -> None:
    commands = _shell_commands((ROOT / "README.md").read_text())
    assert len(commands) >= 8
    commands += _shell_commands((ROOT / "docs" / "USAGE.md").read_text())  # the README's details, moved there
    for command in commands:
        program = command.split()[0]
        assert program.startswith(".venv/bin/") or program == "bash", command
        assert "version_" not in command, command
