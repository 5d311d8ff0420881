"""ZeroCopyLinkDataModule: a PyG-style link module trains unchanged; setup checks; loaders; predict."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from link_helpers import PyGLinkModule, TinyLinkGraph, auroc

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.data.loader import PlanLoader


def _trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(accelerator="cpu", devices=1, default_root_dir=str(tmp_path), **kwargs)


def _datamodule(**kwargs) -> ZeroCopyLinkDataModule:
    dataset = kwargs.pop("dataset", None) or TinyLinkGraph()
    kwargs.setdefault("num_neighbors", [5, 5])
    kwargs.setdefault("batch_size", 64)
    return ZeroCopyLinkDataModule(dataset, **kwargs)


def test_pyg_style_link_module_trains_unchanged_and_learns(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dm = _datamodule()
    model = PyGLinkModule(dm.num_features)
    _trainer(tmp_path, max_epochs=4, num_sanity_val_steps=0).fit(model, datamodule=dm)
    val_steps = -(-dm.dataset.load().split("val").num_positives // 64)
    scores, labels = (torch.cat(t) for t in zip(*model.val_scores[-val_steps:]))
    assert labels.sum() > 0 and (labels == 0).sum() == 3 * labels.sum()  # K = 3 fixed negatives per positive
    assert auroc(scores, labels) > 0.9  # chance is 0.5; community features make the pairs separable


def test_loaders_are_plan_loaders_over_link_plans() -> None:
    dm = _datamodule()
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        assert isinstance(loader, PlanLoader) and isinstance(loader.plan, LinkBatchPlan)
        positives = dm.link_splits["train"].num_positives
        assert len(loader) == -(-positives // 64)
        batches = list(loader)
        assert sum(b.batch_size for b in batches) == positives
        seen = torch.cat([b.input_id for b in batches])
        assert torch.equal(seen.sort().values, torch.arange(positives))  # every positive once per epoch
        assert all(not hasattr(b, "y") or b.y is None for b in batches)  # no node labels in a link batch
    finally:
        dm.teardown("fit")


def test_num_classes_is_absent_and_num_features_is_the_datasets() -> None:
    dm = _datamodule()
    assert dm.num_features == 8
    assert getattr(dm, "num_classes", None) is None
