"""``predict`` with ``data.init_args.predict_mode: layerwise``: exact outputs of every node, layer by layer.

:class:`LayerwisePredictionWriter` runs the pass (:class:`~lightning_zerocopy.data.layerwise.LayerwisePass`) in
``on_predict_start``, once the model is restored, on its device and in eval mode, and writes:

* ``predictions.npz`` (node DataModules), as :class:`~lightning_zerocopy.callbacks.PredictionWriter` writes it:
  ``node_id`` (the ``predict_split`` nodes, or all with ``predict_split: all``, sorted), ``logits``, ``pred``, ``prob``
  and, for a typed graph, ``node_type``; the last layer runs on those nodes only;
* the embeddings of ``layerwise.embeddings`` (a link DataModule: the last layer's, its node embeddings) as
  memory-mapped ``.npy`` files of every node, row ``i`` node ``i``: ``embeddings.npy``, or ``embeddings.<type>.npy``
  per node type of a typed graph (``numpy.load(path, mmap_mode="r")`` reads them without loading them whole).

The ``lightning-zerocopy predict`` command adds it in place of ``PredictionWriter`` when the DataModule's
``predict_mode`` is ``layerwise``. Under DDP (one machine) every rank computes its share of each layer's batches into
the shared tables; global rank 0 writes the files.
"""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter

from lightning_zerocopy.callbacks.predictions import _NpzWriter, _write_npz
from lightning_zerocopy.data.layer_tables import LayerTable, LocalRanks
from lightning_zerocopy.data.layerwise import LayerStats, LayerwisePass
from lightning_zerocopy.models.layerwise import layerwise_module
from lightning_zerocopy.options import RecipeError, RunEnvironmentError
from lightning_zerocopy.outputs import check_output_folder

__all__ = ["LayerwisePredictionWriter", "write_node_predictions"]

_CHUNK_ROWS = 1 << 20  # rows of logits turned into pred / prob at a time


class LayerwisePredictionWriter(_NpzWriter):
    """Runs ``predict_mode: layerwise`` and writes its files (see the module docstring).

    Args:
        output_dir: folder of ``predictions.npz`` and the default embeddings; default: the trainer's ``log_dir``.
        filename: the predictions file's name.
        progress: a progress bar per layer (when the trainer shows one).

    Attributes:
        path: ``predictions.npz`` once written (global rank 0).
        embeddings: the exported ``.npy`` file of each node type.
        stats: this rank's figures of each layer (time, batches, edges, bytes read).
    """

    _NAME = "LayerwisePredictionWriter"
    #: what the DataModule's layer-wise predict loader looks for (``data.layerwise.layerwise_pass_loader``)
    runs_layerwise_pass = True

    def __init__(self, output_dir: Optional[str] = None, filename: str = "predictions.npz", progress: bool = True) -> None:
        super().__init__("epoch", output_dir, filename)
        self.progress = progress
        self.embeddings: dict[str, Path] = {}
        self.stats: list[LayerStats] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Before anything runs: layer-wise mode is on, no other writer competes, one machine, the module has the
        contract (one line naming what to add), the folders can be written."""
        if stage != "predict":
            return
        datamodule = trainer.datamodule
        if getattr(datamodule, "predict_mode", None) != "layerwise":
            raise RecipeError("LayerwisePredictionWriter writes layer-wise predictions: set data.init_args.predict_mode "
                              "to layerwise (a GraphDataModule), or remove the callback")  # fmt: skip
        others = [c for c in trainer.callbacks if isinstance(c, BasePredictionWriter) and c is not self]
        if others:
            raise RecipeError(f"trainer.callbacks lists {type(others[0]).__name__} beside LayerwisePredictionWriter, which "
                              "writes the layer-wise predictions: remove it for predict_mode: layerwise")  # fmt: skip
        if trainer.num_nodes > 1:
            raise RecipeError(f"predict_mode: layerwise shares each layer's outputs in one machine's memory, but "
                              f"trainer.num_nodes is {trainer.num_nodes}: run it on one machine")  # fmt: skip
        layerwise_module(pl_module)
        folder = self._folder(trainer)  # on every rank: a DDP trainer's log_dir is a collective
        if trainer.is_global_zero:
            self._check_target(folder, "the predictions")
            _check_embeddings_target(datamodule)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = trainer.datamodule
        schema = datamodule.schema
        link = bool(datamodule.task.link)
        options = datamodule.layerwise
        if link and options.embeddings is None:
            options = dataclasses.replace(options, embeddings=-1)  # a link module's output: its node embeddings
        folder = Path(trainer.strategy.broadcast(str(self._folder(trainer)), src=0))
        builder = datamodule.builder("predict", layerwise=True).open(datamodule.resources)
        model = layerwise_module(pl_module)
        targets = nodes = None
        if not link:  # the predicted nodes; the last layer runs on them only unless it is exported
            nodes = datamodule.task.input_nodes(datamodule, "predict").to(torch.int64).unique()
            layers = model.layerwise_layers()
            last = len(layers) - 1 if not isinstance(layers, int) else layers - 1
            if options.embeddings is None or options.embeddings not in (-1, last):
                targets = {schema.input_type: nodes}
        embeddings = Path(options.embeddings_path) if options.embeddings_path else (
            folder / "embeddings.npy" if not schema.is_typed else folder)  # fmt: skip
        show = self.progress and trainer.progress_bar_callback is not None
        run = LayerwisePass(builder, model, options, device=pl_module.device, ranks=_local_ranks(trainer),
                            targets=targets, embeddings_path=embeddings, progress=show)  # fmt: skip
        try:
            result = run.run()
            try:
                self.stats, self.embeddings = result.stats, dict(result.embeddings)
                if trainer.is_global_zero and not link:
                    node_type = schema.input_type if schema.is_typed else None
                    table = result.tables[schema.input_type]
                    ids = result.node_ids[schema.input_type]
                    select = nodes if ids is None and datamodule.predict_split != "all" else None
                    self.path = write_node_predictions(folder / self.filename, table, ids, node_type, select)
                trainer.strategy.barrier("lightning_zerocopy.layerwise.written")
            finally:
                result.close()
        finally:
            builder.close()
        written = [str(p) for p in self.embeddings.values()]
        if self.path is not None:
            written.insert(0, str(self.path))
        self._report = f"layer-wise predictions: {', '.join(written)}" if written and trainer.is_global_zero else None

    def write_on_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Any,
                           batch_indices: Any) -> None:  # fmt: skip
        """Nothing: the files were written in ``on_predict_start`` (the pass yields no batch)."""


def write_node_predictions(path: Path, table: LayerTable, node_ids: Optional[torch.Tensor],
                           node_type: Optional[str] = None, select: Optional[torch.Tensor] = None) -> Path:  # fmt: skip
    """``predictions.npz`` from a last layer's table of logits: ``node_id`` (``node_ids``, or each row's index),
    ``logits`` (float32), ``pred`` (argmax), ``prob`` (its softmax probability), ``node_type`` for a typed graph.
    ``select``: the sorted nodes to write of a table whose row ``i`` is node ``i``. The class and probability are
    computed in chunks of rows."""
    data = table.data
    assert data is not None
    if select is not None:
        data, node_ids = data[select.to(data.device)], select
    logits = data.detach().to("cpu", torch.float32).numpy()
    rows = logits.shape[0]
    ids = np.arange(rows, dtype=np.int64) if node_ids is None else node_ids.numpy().astype(np.int64, copy=False)
    pred, prob = np.empty(rows, np.int64), np.empty(rows, np.float32)
    for start in range(0, rows, _CHUNK_ROWS):
        chunk = torch.from_numpy(logits[start : start + _CHUNK_ROWS])
        best = chunk.softmax(dim=1).max(dim=1) if chunk.shape[1] else None
        if best is not None:
            prob[start : start + chunk.shape[0]] = best.values.numpy()
            pred[start : start + chunk.shape[0]] = best.indices.numpy()
    columns = dict(node_id=ids, logits=logits, pred=pred, prob=prob)
    if node_type is not None:
        columns["node_type"] = np.asarray(node_type)
    _write_npz(path, columns)
    return path


def _check_embeddings_target(datamodule: Any) -> None:
    """An explicit ``layerwise.embeddings_path``: the untyped file's folder, or the typed folder, can be written."""
    options = datamodule.layerwise
    if not options.embeddings_path:
        return
    key = "data.init_args.layerwise.embeddings_path"
    path = Path(options.embeddings_path)
    if datamodule.schema.is_typed:
        check_output_folder(path, key)
        return
    if path.suffix != ".npy" or path.is_dir():
        raise RunEnvironmentError(errno.EISDIR if path.is_dir() else errno.EINVAL, f"{key} {path} must name a .npy "
                                  "file (a typed graph's: a folder)")  # fmt: skip
    check_output_folder(path.parent, key)


def _local_ranks(trainer: pl.Trainer) -> LocalRanks:
    """This machine's ranks (layer-wise runs on one machine: every rank is local)."""
    if trainer.world_size == 1:
        return LocalRanks()
    import torch.distributed as dist

    def share(obj: Any) -> Any:
        everyone: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(everyone, obj)
        return everyone[trainer.global_rank - trainer.local_rank]

    return LocalRanks(trainer.local_rank, trainer.num_devices, lambda name: trainer.strategy.barrier(name), share)
