"""Predictions of heterogeneous batches: a dict prediction's own ids, the node type through the ranks' merge, two
types refused (a node's predicted logits equal its test logits for both graph kinds: test_eval_determinism.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from helpers.hetero import PAPER, TinyHeteroDataset, TinyHeteroSAGE
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.callbacks.predictions import PredictionWriter


def _datamodule(**kwargs) -> ZeroCopyHeteroDataModule:
    options = dict(num_neighbors=[3, 2], batch_size=8, eval_batch_size=4, num_threads=1)
    options.update(kwargs)
    return ZeroCopyHeteroDataModule(TinyHeteroDataset(), **options)


def _trainer(tmp_path: Path) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, default_root_dir=str(tmp_path),
                      callbacks=[PredictionWriter(str(tmp_path))])  # fmt: skip


def test_a_dict_prediction_gives_its_own_ids(tmp_path: Path) -> None:
    """A module that returns ``{"n_id", "logits"}`` (HeteroNodeClassifier's form) gets those rows."""
    dm = _datamodule(predict_split="val")

    class DictPredictions(TinyHeteroSAGE):
        def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
            size = batch[PAPER].batch_size
            return {"n_id": batch[PAPER].n_id[:size], "logits": self(batch)[:size]}

    torch.manual_seed(0)
    model = DictPredictions(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes).eval()
    _trainer(tmp_path).predict(model, datamodule=dm, return_predictions=False)
    saved = dict(np.load(tmp_path / "predictions.npz"))
    assert str(saved["node_type"]) == PAPER
    assert saved["node_id"].tolist() == sorted(TinyHeteroDataset().load().val_idx.tolist())


def test_ranks_shares_keep_the_node_type_through_the_merge(tmp_path: Path) -> None:
    """Rank 0 keeps the first row of a node two ranks predicted (padding), as for homogeneous files."""
    from types import SimpleNamespace

    from torch_geometric.data import HeteroData

    def batch(ids: list[int]) -> HeteroData:
        data = HeteroData()
        data[PAPER].n_id = torch.tensor(ids)
        data[PAPER].batch_size = len(ids)
        data["author"].n_id = torch.tensor([100, 101])  # another type's ids: never written
        return data

    strategy = SimpleNamespace(broadcast=lambda obj, src=0: obj, barrier=lambda name=None: None)
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    for rank, ids in ((1, [5, 2]), (0, [2, 7])):  # rank 1 first: rank 0 merges what is there
        trainer = SimpleNamespace(log_dir=str(tmp_path), default_root_dir=str(tmp_path), world_size=2,
                                  global_rank=rank, strategy=strategy)  # fmt: skip
        writer = PredictionWriter()
        writer.on_predict_epoch_start(trainer, None)
        writer.write_on_batch_end(trainer, None, logits[2 * rank : 2 * rank + 2], None, batch(ids), 0, 0)
        writer.on_predict_epoch_end(trainer, None)
    saved = dict(np.load(tmp_path / "predictions.npz"))
    assert str(saved["node_type"]) == PAPER and saved["node_id"].tolist() == [2, 5, 7]
    np.testing.assert_array_equal(saved["logits"], logits[[0, 2, 1]].numpy())


def test_batches_of_two_node_types_in_one_file_are_refused(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from torch_geometric.data import HeteroData

    def batch(node_type: str) -> HeteroData:
        data = HeteroData()
        data[node_type].n_id = torch.tensor([1])
        data[node_type].batch_size = 1
        return data

    trainer = SimpleNamespace(log_dir=str(tmp_path), default_root_dir=str(tmp_path), world_size=1, global_rank=0)
    writer = PredictionWriter()
    writer.on_predict_epoch_start(trainer, None)
    writer.write_on_batch_end(trainer, None, torch.zeros(1, 2), None, batch(PAPER), 0, 0)
    with pytest.raises(ValueError, match="different node types \\('paper', then 'author'\\)"):
        writer.write_on_batch_end(trainer, None, torch.zeros(1, 2), None, batch("author"), 1, 0)
