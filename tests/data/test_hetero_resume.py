"""A heterogeneous fit resumed mid-epoch trains exactly the batches it had left (the plan is the homogeneous
``BatchPlan`` over the input type's training split, the loader the homogeneous ``PlanLoader``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from helpers.hetero import EDGE_TYPES, PAPER, TinyHeteroDataset, TinyHeteroSAGE
from lightning_zerocopy import ZeroCopyHeteroDataModule


class _Record(Callback):
    """Every training batch's paper ids and each edge type's edge ids, by ``(epoch, batch_idx)``."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        fields = {"n_id": batch[PAPER].n_id.clone(), "seeds": batch[PAPER].n_id[: batch[PAPER].batch_size].clone()}
        fields.update({"__".join(et): batch[et].e_id.clone() for et in EDGE_TYPES})
        self.seen[(trainer.current_epoch, batch_idx)] = fields


def _datamodule(batch_size: int = 3) -> ZeroCopyHeteroDataModule:
    return ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=batch_size, num_threads=1)


def _fit(tmp_path: Path, dm: ZeroCopyHeteroDataModule, callbacks: list, ckpt_path=None) -> pl.Trainer:
    pl.seed_everything(0)
    model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_val_batches=0, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=callbacks)  # fmt: skip
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer


def _first_run(tmp_path: Path) -> tuple[_Record, int]:
    record = _Record()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    trainer = _fit(tmp_path, _datamodule(), [record, ckpt])
    steps_per_epoch = trainer.num_training_batches
    assert steps_per_epoch == 7  # 20 training papers, 3 a batch
    return record, steps_per_epoch


def test_resume_mid_epoch_trains_the_remaining_batches_unchanged(tmp_path: Path) -> None:
    record, steps_per_epoch = _first_run(tmp_path)
    resume_step = 8  # epoch 1, batch 1: mid-epoch
    resumed = _Record()
    _fit(tmp_path, _datamodule(), [resumed], ckpt_path=tmp_path / "ckpt" / f"step={resume_step}.ckpt")
    expected = {key: v for key, v in record.seen.items() if key[0] * steps_per_epoch + key[1] >= resume_step}
    assert sorted(resumed.seen) == sorted(expected) and len(expected) == 6
    for key, fields in expected.items():
        for name, value in fields.items():
            assert torch.equal(resumed.seen[key][name], value), (key, name)


def test_resume_with_another_batch_size_trains_each_remaining_seed_once(tmp_path: Path) -> None:
    record, _ = _first_run(tmp_path)
    resume_step = 8  # epoch 1 trained its batch 0 (3 seeds) before the checkpoint
    resumed = _Record()
    _fit(tmp_path, _datamodule(batch_size=5), [resumed], ckpt_path=tmp_path / "ckpt" / f"step={resume_step}.ckpt")
    epoch_seeds = [int(s) for (epoch, _), f in record.seen.items() if epoch == 1 for s in f["seeds"]]
    before = [int(s) for s in record.seen[(1, 0)]["seeds"]]
    after = [int(s) for (epoch, _), f in resumed.seen.items() if epoch == 1 for s in f["seeds"]]
    counts = Counter(before + after)
    assert set(counts) == set(epoch_seeds) and len(counts) == 20 and max(counts.values()) == 1
    assert max(f["seeds"].numel() for (epoch, _), f in resumed.seen.items() if epoch == 1) <= 5
