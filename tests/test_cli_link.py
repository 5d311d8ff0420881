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


def test_a_checkpoint_of_another_module_class_is_one_line_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LightningCLI takes the model's class from the checkpoint: a node checkpoint switched a link recipe to the node
    model, which died on the link batches (``TypeError: 'NoneType' object is not subscriptable`` at ``batch.y``)."""
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    quickstart = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
    main(["fit", "--config", str(quickstart), "--data.init_args.dataset.init_args.num_nodes=600", "--trainer.max_steps=1",
          "--trainer.limit_val_batches=1", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          f"--trainer.default_root_dir={tmp_path / 'node'}"])  # fmt: skip
    node_ckpt = next((tmp_path / "node").rglob("*.ckpt"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", _recipe(tmp_path), f"--ckpt_path={node_ckpt}", f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == (
        f"error: --ckpt_path {node_ckpt} is a checkpoint of lightning_zerocopy.models.GraphSAGE, but the recipe's "
        "model.class_path is helpers.link.PyGLinkModule: pass a checkpoint that model wrote, or the recipe the "
        "checkpoint was trained with"
    ), lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


def test_a_loss_that_does_not_fit_the_negatives_is_one_line_at_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", _recipe(tmp_path), "--model=lightning_zerocopy.models.LinkPredictor",
              "--model.init_args.loss=bce", "--data.init_args.neg_sampling=triplet",
              f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == (
        "error: model.loss='bce' trains on binary batches, but data.neg_sampling's mode is triplet: set model.loss to "
        "bpr or margin, or data.neg_sampling to 'binary'"
    ), lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


@pytest.mark.parametrize(
    "override, expected",
    [
        ("--data.init_args.neg_sampling_ration=1.0", "`data.init_args.neg_sampling_ration` is not an option of "
         "lightning_zerocopy.ZeroCopyLinkDataModule: did you mean `neg_sampling_ratio`?"),
        ("--data.init_args.dataset.init_args.num_node=300", "`data.init_args.dataset.init_args.num_node` is not an "
         "option of helpers.link.TinyLinkGraph: did you mean `num_nodes`?"),
    ],
)
def test_a_misspelled_link_key_is_named_first_with_the_closest_valid_one(
    override: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """jsonargparse's first line was ``error: Parser key "data":``, the key two lines further."""
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", _recipe(tmp_path), override, f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == f"error: {expected}", lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines



def test_predictions_name_their_columns_and_the_line_is_not_glued_to_the_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _recipe(tmp_path)
    reference = ["--model=lightning_zerocopy.models.LinkPredictor", "--model.init_args.hits_k=[1]"]
    main(["fit", "--config", recipe, *reference, f"--trainer.default_root_dir={tmp_path}"])
    ckpt = next(tmp_path.rglob("*.ckpt"))
    capsys.readouterr()
    main(["predict", "--config", recipe, *reference, f"--trainer.default_root_dir={tmp_path / 'pred'}",
          f"--ckpt_path={ckpt}", "--trainer.enable_progress_bar=true"])  # fmt: skip
    out = capsys.readouterr().out
    assert any(line.startswith("predictions: ") for line in out.replace("\r", "\n").splitlines()), out[-500:]
    assert "it/s]predictions" not in out
    p = np.load(next((tmp_path / "pred").rglob("predictions.npz")))
    assert p["label"].dtype == np.int64 and set(np.unique(p["label"]).tolist()) <= {0, 1}
    np.testing.assert_allclose(p["score"], 1 / (1 + np.exp(-p["logit"].astype(np.float64))), rtol=1e-5)
