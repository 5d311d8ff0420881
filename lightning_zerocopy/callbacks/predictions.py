"""Writes ``predict`` outputs to disk: one ``.npz`` file of node ids, logits, predicted class and probability.

The ``lightning-zerocopy predict`` command adds :class:`PredictionWriter` unless the recipe lists a
``BasePredictionWriter`` of its own. The file is a plain NumPy archive, readable without this package::

    p = numpy.load("lightning_logs/version_0/predictions.npz")
    p["node_id"], p["logits"], p["pred"], p["prob"]                     # numpy
    {k: torch.from_numpy(v) for k, v in numpy.load(path).items()}       # torch
    pandas.DataFrame({k: p[k] for k in ("node_id", "pred", "prob")})    # pandas (logits are 2-D)

A module's ``predict_step`` may return the logits (a tensor; rows beyond the batch's seed nodes are dropped and
the node ids are taken from ``batch.n_id``) or a dict with ``"logits"`` and optionally ``"n_id"``.

Under DDP every rank writes its share to ``predictions.rank<R>.npz``; after a barrier, global rank 0 merges the
shares it can read (same file system) into ``predictions.npz`` and deletes them. Rows are sorted by node id and
each node appears once (a distributed plan pads the ranks' shares by repeating nodes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.utilities import rank_zero_info

__all__ = ["PredictionWriter", "seed_predictions"]


def seed_predictions(prediction: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(node ids, logits)`` of a batch's seed nodes from what ``predict_step`` returned.

    Args:
        prediction: a logits tensor (``[num_nodes or batch_size, num_classes]``) or a dict with ``"logits"``
            and optionally ``"n_id"`` (global ids of the rows).
        batch: the batch ``predict_step`` received; its ``n_id`` and ``batch_size`` are used where
            ``prediction`` does not give the ids.

    Raises:
        TypeError: ``prediction`` is neither, or the node ids cannot be found.
    """
    n_id: Optional[torch.Tensor] = None
    if isinstance(prediction, dict):
        if "logits" not in prediction:
            raise TypeError(
                f"predict_step returned a dict with keys {sorted(prediction)}; the prediction writer needs 'logits' "
                "(and optionally 'n_id')"
            )
        logits, n_id = prediction["logits"], prediction.get("n_id")
    else:
        logits = prediction
    if not isinstance(logits, torch.Tensor) or logits.dim() not in (1, 2):
        raise TypeError(
            "predict_step must return the logits (a [nodes, classes] tensor) or a dict with 'logits' and 'n_id'; "
            f"got {type(logits).__name__}"
        )
    batch_size = getattr(batch, "batch_size", None)
    if n_id is None:
        batch_n_id = getattr(batch, "n_id", None)
        if batch_n_id is None or batch_size is None:
            raise TypeError("predict_step returned no 'n_id' and the batch has no n_id/batch_size to take them from")
        n_id = batch_n_id[:batch_size]
    rows = n_id.numel()
    if logits.shape[0] < rows:
        raise TypeError(f"predict_step returned {logits.shape[0]} rows of logits for {rows} seed nodes")
    return n_id.reshape(-1), logits[:rows]


class PredictionWriter(BasePredictionWriter):
    """Collects the seed nodes' logits of every predict batch and writes them to one ``.npz`` file at the end.

    Args:
        output_dir: folder of the file; default: the trainer's ``log_dir`` (``default_root_dir`` without a
            logger).
        filename: file name, default ``predictions.npz``.
    """

    def __init__(self, output_dir: Optional[str] = None, filename: str = "predictions.npz") -> None:
        super().__init__(write_interval="batch")
        if not filename.endswith(".npz"):
            raise ValueError(f"filename must end with .npz, got {filename!r}")
        self.output_dir = output_dir
        self.filename = filename
        self.path: Optional[Path] = None  # the merged file, once written
        self._ids: list[torch.Tensor] = []
        self._logits: list[torch.Tensor] = []

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ids, self._logits = [], []

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Optional[Sequence[int]],
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        n_id, logits = seed_predictions(prediction, batch)
        self._ids.append(n_id.detach().to("cpu", torch.int64))
        self._logits.append(logits.detach().to("cpu", torch.float32))

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folder = Path(self.output_dir or trainer.log_dir or trainer.default_root_dir)
        ids = torch.cat(self._ids) if self._ids else torch.empty(0, dtype=torch.int64)
        logits = torch.cat(self._logits) if self._logits else torch.empty(0, 0)
        self._ids, self._logits = [], []
        world = trainer.world_size
        if world == 1:
            self.path = _save(folder / self.filename, [ids.numpy()], [logits.numpy()])
            print(f"predictions: {ids.numel()} nodes written to {self.path}", flush=True)
            return
        # a rank's log_dir may differ (loggers resolve it on rank 0): everyone writes where rank 0 does
        folder = Path(trainer.strategy.broadcast(str(folder), src=0))
        stem = self.filename[: -len(".npz")]
        part = folder / f"{stem}.rank{trainer.global_rank}.npz"
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(_tmp(part), node_id=ids.numpy(), logits=logits.numpy())
        os.replace(_tmp(part), part)
        trainer.strategy.barrier("lightning_zerocopy.predictions")
        if trainer.global_rank != 0:
            return
        parts = [folder / f"{stem}.rank{r}.npz" for r in range(world)]
        if not all(p.exists() for p in parts):  # ranks on other machines without a shared file system
            rank_zero_info(f"predictions: each rank wrote its share to {folder}/{stem}.rank<R>.npz on its machine")
            return
        loaded = [np.load(p) for p in parts]
        self.path = _save(folder / self.filename, [f["node_id"] for f in loaded], [f["logits"] for f in loaded])
        for p in parts:
            p.unlink()
        print(f"predictions: nodes of {world} ranks written to {self.path}", flush=True)


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp.npz")


def _save(path: Path, ids: list[np.ndarray], logits: list[np.ndarray]) -> Path:
    """Writes node ids (sorted, each once), logits, argmax class and its softmax probability; returns ``path``."""
    all_ids = np.concatenate(ids) if ids else np.empty(0, np.int64)
    widths = {a.shape[1] for a in logits if a.ndim == 2 and a.shape[0]}
    if len(widths) > 1:
        raise ValueError(f"predict_step returned logits of different widths across batches: {sorted(widths)}")
    width = widths.pop() if widths else 0
    all_logits = np.concatenate([a.reshape(a.shape[0], -1) for a in logits if a.shape[0]] or [np.empty((0, width))])
    all_ids, first = np.unique(all_ids, return_index=True)
    all_logits = all_logits[first].astype(np.float32, copy=False)
    if all_logits.shape[1]:
        shifted = all_logits - all_logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
        pred = all_logits.argmax(axis=1)
        prob = probs[np.arange(len(pred)), pred].astype(np.float32)
    else:
        pred, prob = np.empty(0, np.int64), np.empty(0, np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(_tmp(path), node_id=all_ids, logits=all_logits, pred=pred.astype(np.int64), prob=prob)
    os.replace(_tmp(path), path)
    return path
