"""The drop-in tests' measure: a module written for PyG's loaders, validated before and after a short CPU fit."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

__all__ = ["fit_and_validate"]


def _trainer(steps: int, val_batches: int) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=val_batches, num_sanity_val_steps=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip


def fit_and_validate(model: pl.LightningModule, train: Any = None, val: Any = None, datamodule: Any = None, *,
                     metric: str, steps: int, val_batches: int) -> tuple[float, float]:  # fmt: skip
    """The logged validation figure ``metric`` before and after ``steps`` training steps (``val_batches`` validation
    batches), on the loaders ``train`` and ``val`` or on ``datamodule``."""
    loaders = {"datamodule": datamodule} if datamodule is not None else {}
    before = _trainer(0, val_batches).validate(model, dataloaders=val, verbose=False, **loaders)[0][metric]
    trainer = _trainer(steps, val_batches)
    if datamodule is not None:
        trainer.fit(model, datamodule=datamodule)
    else:
        trainer.fit(model, train, val)
    after = trainer.validate(model, dataloaders=val, verbose=False, **loaders)[0][metric]
    return before, after
