"""Checkpoints of every reference model saved before the models shared their bases still load: the layouts written
then (``checkpoint_layouts.json``, by ``checkpoint_layouts.py``) are today's, and a checkpoint of that layout loads
into today's class with every weight in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.checkpoint_layouts import CASES, LAYOUTS, build, layout

from lightning_zerocopy import models

SAVED = json.loads(LAYOUTS.read_text())


def test_every_reference_model_has_a_saved_layout() -> None:
    assert set(SAVED) == set(CASES)
    assert {case["class"] for case in SAVED.values()} == {"GraphSAGE", "GAT", "HeteroNodeClassifier", "LinkPredictor",
                                                          "HeteroLinkPredictor"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_todays_model_has_the_saved_hyperparameters_and_state_dict(name: str) -> None:
    saved = SAVED[name]
    now = layout(build(name))
    assert now["hparams"] == saved["hparams"]
    assert list(now["state_dict"].items()) == list(saved["state_dict"].items())  # keys, their order and shapes


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_of_the_saved_layout_loads_every_weight(name: str, tmp_path: Path) -> None:
    saved = SAVED[name]
    gen = torch.Generator().manual_seed(0)
    weights = {key: torch.randn(shape, generator=gen) for key, shape in saved["state_dict"].items()}
    path = tmp_path / f"{name}.ckpt"
    torch.save({"state_dict": weights, "hyper_parameters": saved["hparams"], "pytorch-lightning_version": pl.__version__},
               path)  # fmt: skip
    restored = getattr(models, saved["class"]).load_from_checkpoint(path)
    state = restored.state_dict()
    assert list(state) == list(weights)
    for key, value in weights.items():
        assert torch.equal(state[key], value), key
