"""The command with ZeroCopyLinkDataModule: a link recipe fits and predicts, bad link keys give one line naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightning_zerocopy._cli_errors import TRACEBACK_ENV
from lightning_zerocopy.cli import main

RECIPE = """
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 1
  limit_train_batches: 3
  limit_val_batches: 2
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
model:
  class_path: helpers.link.PyGLinkModule
  init_args:
    hidden_channels: 16
data:
  class_path: lightning_zerocopy.ZeroCopyLinkDataModule
  init_args:
    dataset:
      class_path: helpers.link.TinyLinkGraph
    num_neighbors: [4, 4]
    batch_size: 64
    neg_sampling: {mode: binary, amount: 2, dst_weight: degree}
"""


def _recipe(tmp_path: Path) -> str:
    path = tmp_path / "link.yaml"
    path.write_text(RECIPE)
    return str(path)


def test_a_link_recipe_fits_and_predicts_the_scored_edges(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    main(["fit", "--config", recipe, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("*.ckpt"))
    main(["predict", "--config", recipe, f"--trainer.default_root_dir={tmp_path / 'pred'}", f"--ckpt_path={ckpt}"])
    p = np.load(next((tmp_path / "pred").rglob("predictions.npz")))
    assert {"src", "dst", "score", "label", "query"} <= set(p.files) and len(p["score"]) > 0


@pytest.mark.parametrize(
    "override, expected",
    [
        ("--data.init_args.neg_sampling_ratio=-0.5", "data.init_args.neg_sampling_ratio must be a finite number >= 0"),
        ("--data.init_args.neg_sampling=tripletx", "data.init_args.neg_sampling mode must be one of ('binary', 'triplet')"),
        ("--data.init_args.neg_sampling={mode: triplet, amount: 2.5}", "data.init_args.neg_sampling amount must be an integer"),
        ("--data.init_args.neg_sampling={mode: binary, weights: degree}", "data.init_args.neg_sampling has unknown key(s) ['weights']"),
        ("--data.init_args.num_neighbors=[4,0]", "`data.init_args.num_neighbors[1]` must be a positive neighbor count"),
    ],
)
def test_a_bad_link_key_prints_one_message_naming_it(
    override: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", _recipe(tmp_path), override, f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and expected in lines[0], lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines
