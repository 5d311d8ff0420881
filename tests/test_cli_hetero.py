"""The ``lightning-zerocopy`` command with ``HeteroNodeClassifier``: ``recipes/hetero_mag.yaml``'s trainer and model
sections over a stand-in heterogeneous DataModule of hand-built batches (``helpers.hetero_batches``; the recipe's own
``ZeroCopyHeteroDataModule`` runs in ``test_hetero_recipe_fits``): the dict of feature widths is
linked into ``in_channels``, the model reads the graph's shape from the DataModule, and ``test``/``predict`` with
``--ckpt_path`` rebuild the layers from the checkpoint's hyperparameters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lightning_zerocopy.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "hetero_mag.yaml"



def _recipe(tmp_path: Path, stand_in: bool) -> Path:
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["trainer"].update(max_epochs=1, default_root_dir=str(tmp_path), enable_progress_bar=False)
    if stand_in:
        recipe["data"] = {"class_path": "helpers.hetero_batches.HandBuiltHeteroDataModule",
                          "init_args": {"papers": 300, "batch_size": 30, "num_neighbors": [4, 3]}}  # fmt: skip
    else:
        recipe["trainer"]["limit_train_batches"] = 5
        recipe["trainer"]["limit_val_batches"] = 2
        recipe["data"]["init_args"]["dataset"]["init_args"]["num_papers"] = 2000
    path = tmp_path / "hetero.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_hetero_recipe_model_fits_tests_and_predicts_through_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LZC_TRACEBACK", "1")
    monkeypatch.chdir(tmp_path)
    path = _recipe(tmp_path, stand_in=True)
    main(["fit", "--config", str(path)])
    (last,) = tmp_path.rglob("last.ckpt")
    config = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())
    assert config["model"]["class_path"] == "lightning_zerocopy.models.HeteroNodeClassifier"
    saved = torch.load(last, map_location="cpu", weights_only=False)["hyper_parameters"]
    assert saved["in_channels"] == {"paper": 8} and saved["input_type"] == "paper"  # linked, then read from the data
    assert "author__writes__paper" in saved["edge_types"] and saved["num_nodes"]["author"] == 150
    main(["test", "--config", str(path), "--ckpt_path", str(last)])
    main(["predict", "--config", str(path), "--ckpt_path", str(last)])
    (written,) = tmp_path.rglob("predictions.npz")
    with np.load(written) as predictions:
        assert predictions["node_id"].shape[0] == 60  # the 20 % test papers
        assert predictions["logits"].shape == (60, 4)


def test_hetero_recipe_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LZC_TRACEBACK", "1")
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(_recipe(tmp_path, stand_in=False))])
    assert list(tmp_path.rglob("last.ckpt"))
