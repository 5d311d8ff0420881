"""Writes ``predict`` outputs to disk: one ``.npz`` file of node ids, logits, predicted class and probability, or,
for link batches, of the scored edges.

The ``lightning-zerocopy predict`` command adds :class:`PredictionWriter` unless the recipe lists a
``BasePredictionWriter`` of its own. The file is a plain NumPy archive, readable without this package::

    p = numpy.load("lightning_logs/version_0/predictions.npz")
    p["node_id"], p["logits"], p["pred"], p["prob"]                     # numpy
    {k: torch.from_numpy(v) for k, v in numpy.load(path).items()}       # torch
    pandas.DataFrame({k: p[k] for k in ("node_id", "pred", "prob")})    # pandas (logits are 2-D)

A module's ``predict_step`` may return the logits (a tensor; rows beyond the batch's seed nodes are dropped and
the node ids are taken from ``batch.n_id``) or a dict with ``"logits"`` and optionally ``"n_id"``.

Heterogeneous batches (``HeteroData``: :class:`~lightning_zerocopy.ZeroCopyHeteroDataModule`) give one row per seed of
the input type: the seeds' type is the node type whose store holds ``batch_size`` (as PyG's hetero ``NeighborLoader``
marks it), ``node_id`` are ids of that type (``batch[type].n_id``, or the dict's ``"n_id"``), and the file records the
type as ``node_type`` (a 0-d string array: ``str(p["node_type"])``). A homogeneous file has no ``node_type``.

On a GPU each batch's rows are copied to pinned host memory without waiting (``non_blocking``), so ``predict`` steps
queue ahead of the GPU; a copy is moved to ordinary memory once it has landed, and the epoch's end waits for the last.

Link batches (those with ``edge_label_index``: :class:`~lightning_zerocopy.ZeroCopyLinkDataModule`) give one row per
scored edge: ``src``, ``dst`` (global ids), ``score`` (float32: what ``predict_step`` returned for ``edge_label_index``,
a ``[E]`` or ``[E, C]`` tensor, or a dict's ``"score"``, ``"scores"`` or ``"logits"``, the first present; for
:class:`~lightning_zerocopy.models.LinkPredictor` the probability), ``logit`` (float32, when the dict also has
``"logits"``: LinkPredictor's logits), and where the batch has them ``label`` (``edge_label``: int64 when its values
are whole numbers, as they are for our link batches) and ``query`` (``edge_label_query``). Rows are sorted by
``(src, dst)``, each ``(src, dst, query)`` once (DDP padding repeats none).

The line that names the file is printed when the run is torn down, after the progress bar has closed its line.

Heterogeneous link batches (:class:`~lightning_zerocopy.ZeroCopyHeteroLinkDataModule`: the edge store holding
``edge_label_index``) give the same rows, ``src`` ids of the edge type's source type and ``dst`` ids of its
destination type, and the file records the type as ``edge_type`` (a 0-d string array, PyG's ``src__rel__dst``).

Under DDP every rank writes its share to ``predictions.rank<R>.npz``; after a barrier, global rank 0 merges the
shares it can read (same file system) into ``predictions.npz`` and deletes them. Rows are sorted by node id and
each node appears once (a distributed plan pads the ranks' shares by repeating nodes).
"""

from __future__ import annotations

import errno
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.utilities import rank_zero_info

from lightning_zerocopy.options import RunEnvironmentError
from lightning_zerocopy.outputs import check_output_folder

__all__ = ["PredictionWriter", "edge_predictions", "link_edge_type", "seed_node_type", "seed_predictions"]


def seed_node_type(batch: Any) -> Optional[str]:
    """The node type of a heterogeneous batch's seeds (the node store holding ``batch_size``), or ``None`` for a
    homogeneous batch.

    Raises:
        TypeError: a ``HeteroData`` batch without a node store that holds ``batch_size``.
    """
    if not is_hetero(batch):
        return None
    for store in batch.node_stores:
        if "batch_size" in store:
            return store._key
    raise TypeError("the heterogeneous batch has no node type with batch_size: the prediction writer cannot tell the "
                    "seeds' type (ZeroCopyHeteroDataModule's batches set it on the input type)")  # fmt: skip


def link_edge_type(batch: Any) -> Optional[tuple[str, str, str]]:
    """The edge type of a heterogeneous link batch (the edge store holding ``edge_label_index``), or ``None``."""
    return next((s._key for s in batch.edge_stores if "edge_label_index" in s), None) if is_hetero(batch) else None


def is_hetero(batch: Any) -> bool:
    """Whether ``batch`` is a PyG ``HeteroData`` (without importing PyG: these callbacks must not, see the package's
    docstring; a batch can only be one once PyG is imported)."""
    pyg_data = sys.modules.get("torch_geometric.data")
    return pyg_data is not None and isinstance(batch, pyg_data.HeteroData)


def seed_predictions(prediction: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(node ids, logits)`` of a batch's seed nodes from what ``predict_step`` returned.

    Args:
        prediction: a logits tensor (``[num_nodes or batch_size, num_classes]``) or a dict with ``"logits"``
            and optionally ``"n_id"`` (global ids of the rows).
        batch: the batch ``predict_step`` received; its ``n_id`` and ``batch_size`` are used where
            ``prediction`` does not give the ids (those of the seeds' type for a ``HeteroData`` batch:
            :func:`seed_node_type`).

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
    node_type = seed_node_type(batch)
    seeds = batch if node_type is None else batch[node_type]
    batch_size = getattr(seeds, "batch_size", None)
    if n_id is None:
        batch_n_id = getattr(seeds, "n_id", None)
        if batch_n_id is None or batch_size is None:
            raise TypeError("predict_step returned no 'n_id' and the batch has no n_id/batch_size to take them from")
        n_id = batch_n_id[:batch_size]
    rows = n_id.numel()
    if logits.shape[0] < rows:
        raise TypeError(f"predict_step returned {logits.shape[0]} rows of logits for {rows} seed nodes")
    return n_id.reshape(-1), logits[:rows]


def edge_predictions(prediction: Any, batch: Any) -> dict[str, torch.Tensor]:
    """The scored edges of a link batch: ``src``, ``dst`` (global ids), ``score``, ``logit`` when the prediction
    gives logits beside another score and, where the batch has them, ``label`` and ``query``.

    Args:
        prediction: scores of ``batch.edge_label_index`` (a ``[E]`` / ``[E, C]`` tensor) or a dict with ``"score"``,
            ``"scores"`` or ``"logits"`` (the first present, in that order, is ``score``; ``"logits"`` after another
            is ``logit``).
        batch: the link batch ``predict_step`` received.

    Raises:
        TypeError: ``prediction`` is neither, or has another number of rows than the batch has label edges.
    """
    scores = prediction
    if isinstance(prediction, dict):
        key = next((k for k in ("score", "scores", "logits") if k in prediction), None)
        if key is None:
            raise TypeError(
                f"predict_step returned a dict with keys {sorted(prediction)}; link predictions need 'score' (or "
                "'scores' / 'logits')"
            )
        scores = prediction[key]
    edge_type = link_edge_type(batch)
    if edge_type is None:
        edges, store = batch.n_id[batch.edge_label_index], batch
    else:  # each row indexes its endpoint type's n_id
        store = batch[edge_type]
        index = store.edge_label_index
        edges = torch.stack([batch[edge_type[0]].n_id[index[0]], batch[edge_type[-1]].n_id[index[1]]])
    if not isinstance(scores, torch.Tensor) or scores.dim() not in (1, 2) or scores.shape[0] != edges.shape[1]:
        raise TypeError(
            f"predict_step must return one score per edge of batch.edge_label_index ({edges.shape[1]} rows; a tensor "
            f"or a dict with 'scores'), got "
            f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}"
        )
    columns = {"src": edges[0], "dst": edges[1], "score": scores}
    if isinstance(prediction, dict) and key != "logits" and isinstance(prediction.get("logits"), torch.Tensor):
        logits = prediction["logits"]
        if logits.shape[:1] != scores.shape[:1]:
            raise TypeError(f"predict_step returned {logits.shape[0]} logits for {scores.shape[0]} scores")
        columns["logit"] = logits
    for name, field in (("label", "edge_label"), ("query", "edge_label_query")):
        value = getattr(store, field, None)
        if isinstance(value, torch.Tensor):
            columns[name] = value
    return columns


class _NpzWriter(BasePredictionWriter):
    """What both prediction writers share: an ``.npz`` ``filename`` in ``output_dir`` (default: the trainer's
    ``log_dir``), checked before the run, and the line naming what was written, printed at teardown."""

    _NAME = "PredictionWriter"  # the writer named in messages (a subclass of it is still one)

    def __init__(self, write_interval: str, output_dir: Optional[str], filename: str) -> None:
        super().__init__(write_interval=write_interval)
        if not filename.endswith(".npz"):
            raise ValueError(f"filename must end with .npz, got {filename!r}")
        self.output_dir = output_dir
        self.filename = filename
        self.path: Optional[Path] = None  # the (merged) file, once written
        self._report: Optional[str] = None  # the line naming it, printed at teardown (after the progress bar's)

    def _folder(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir or trainer.log_dir or trainer.default_root_dir)

    def _key(self) -> str:
        return f"{self._NAME}'s output_dir" if self.output_dir else "trainer.default_root_dir"

    def _check_target(self, folder: Path, what: str) -> None:
        """``folder`` can be written, and the file's name in it is no folder (``what``: the file, for the message)."""
        folder = check_output_folder(folder, self._key())
        if (folder / self.filename).is_dir():
            raise RunEnvironmentError(errno.EISDIR, f"{folder / self.filename} is a folder: {what} cannot be written "
                                      f"there; move it, or set {self._key()} elsewhere")  # fmt: skip

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Prints the line naming the file: the progress bar has ended its line by now (it does in
        ``on_predict_end``, which may run after this callback's ``on_predict_epoch_end``, depending on the order of
        the callbacks), so the line is not glued to the bar's."""
        report, self._report = self._report, None
        if report is not None:
            print(report, flush=True)


class PredictionWriter(_NpzWriter):
    """Collects the seed nodes' logits of every predict batch and writes them to one ``.npz`` file at the end.

    Args:
        output_dir: folder of the file; default: the trainer's ``log_dir`` (``default_root_dir`` without a
            logger).
        filename: file name, default ``predictions.npz``.
    """

    def __init__(self, output_dir: Optional[str] = None, filename: str = "predictions.npz") -> None:
        super().__init__("batch", output_dir, filename)
        self._ids: list[torch.Tensor] = []
        self._logits: list[torch.Tensor] = []
        self._landing: deque[tuple[torch.Tensor, torch.Tensor, Any]] = deque()  # GPU copies not yet waited for
        self._edges: list[dict[str, torch.Tensor]] = []  # link batches: one dict of columns per batch
        self._node_type: Optional[str] = None  # the seeds' node type of heterogeneous batches
        self._edge_type: Optional[str] = None  # the supervised edge type of heterogeneous link batches
        self._node_batches = 0  # node batches of this epoch

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Before anything is predicted: the destination folder can be written, and the file's name is no folder."""
        if stage == "predict" and trainer.is_global_zero:
            self._check_target(self._folder(trainer), "the predictions file")

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ids, self._logits, self._landing, self._edges = [], [], deque(), []
        self._node_type, self._node_batches, self._edge_type = None, 0, None

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
        edge_type = link_edge_type(batch)
        if edge_type is not None or getattr(batch, "edge_label_index", None) is not None:
            columns = edge_predictions(prediction, batch)
            self._edge_type = None if edge_type is None else "__".join(edge_type)
            self._edges.append({k: v.detach().to("cpu", torch.float32 if k in ("score", "logit") else v.dtype)
                                for k, v in columns.items()})  # fmt: skip
            return
        n_id, logits = seed_predictions(prediction, batch)
        node_type = seed_node_type(batch)
        if self._node_batches and node_type != self._node_type:
            raise ValueError(f"predict batches of different node types ({self._node_type!r}, then {node_type!r}): one "
                             "predictions file holds the nodes of one type")  # fmt: skip
        self._node_type, self._node_batches = node_type, self._node_batches + 1
        if not (n_id.is_cuda or logits.is_cuda):
            self._ids.append(n_id.detach().to("cpu", torch.int64))
            self._logits.append(logits.detach().to("cpu", torch.float32))
            return
        ids_host, logits_host = _to_pinned(n_id.detach(), torch.int64), _to_pinned(logits.detach(), torch.float32)
        device = n_id.device if n_id.is_cuda else logits.device
        landed = torch.cuda.Event()
        landed.record(torch.cuda.current_stream(device))
        self._landing.append((ids_host, logits_host, landed))
        self._land(wait=False)

    def _land(self, wait: bool) -> None:
        """Move the copies that have landed (``wait``: all, waiting for them) from pinned to ordinary memory, so the
        pinned buffers go back to the allocator while the epoch runs."""
        while self._landing and (wait or self._landing[0][2].query()):  # query() does not block
            ids, logits, landed = self._landing.popleft()
            if wait:
                landed.synchronize()
            self._ids.append(ids.clone())
            self._logits.append(logits.clone())

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._land(wait=True)
        folder = self._folder(trainer)
        if self._edges:
            columns = {k: torch.cat([b[k] for b in self._edges]).numpy() for k in self._edges[0]}
            if self._edge_type is not None:
                columns["edge_type"] = np.asarray(self._edge_type)
        else:
            ids = torch.cat(self._ids) if self._ids else torch.empty(0, dtype=torch.int64)
            logits = torch.cat(self._logits) if self._logits else torch.empty(0, 0)
            columns = {"node_id": ids.numpy(), "logits": logits.numpy()}
            if self._node_type is not None:
                columns["node_type"] = np.asarray(self._node_type)
        self._ids, self._logits, self._edges = [], [], []
        world = trainer.world_size
        if world == 1:
            self.path, what = _save_columns(folder / self.filename, [columns])
            self._report = f"predictions: {what} written to {self.path}"
            return
        # a rank's log_dir may differ (loggers resolve it on rank 0): everyone writes where rank 0 does
        folder = Path(trainer.strategy.broadcast(str(folder), src=0))
        stem = self.filename[: -len(".npz")]
        part = folder / f"{stem}.rank{trainer.global_rank}.npz"
        _write_npz(part, columns)
        trainer.strategy.barrier("lightning_zerocopy.predictions")
        if trainer.global_rank != 0:
            return
        parts = [folder / f"{stem}.rank{r}.npz" for r in range(world)]
        if not all(p.exists() for p in parts):  # ranks on other machines without a shared file system
            rank_zero_info(f"predictions: each rank wrote its share to {folder}/{stem}.rank<R>.npz on its machine")
            return
        loaded = [dict(np.load(p)) for p in parts]
        self.path, what = _save_columns(folder / self.filename, loaded)
        for p in parts:
            p.unlink()
        self._report = f"predictions: {what} of {world} ranks written to {self.path}"


def _save_columns(path: Path, shares: list[dict[str, np.ndarray]]) -> tuple[Path, str]:
    """Merge the ranks' shares of node rows (``node_id``/``logits``) or edge rows (``src``/``dst``/``score``...)."""
    if "node_id" in shares[0]:
        node_type = str(shares[0]["node_type"]) if "node_type" in shares[0] else None
        saved = _save(path, [s["node_id"] for s in shares], [s["logits"] for s in shares], node_type)
        nodes = "nodes" if node_type is None else f"{node_type!r} nodes"
        count = int(np.unique(np.concatenate([s["node_id"] for s in shares])).size)  # each node once, as saved
        return saved, f"{count} {nodes}"
    edge_type = str(shares[0]["edge_type"]) if "edge_type" in shares[0] else None
    columns = {k: np.concatenate([s[k] for s in shares]) for k in shares[0] if k != "edge_type"}
    label = columns.get("label")
    if label is not None and label.dtype.kind == "f" and np.array_equal(label, np.round(label)):
        columns["label"] = label.astype(np.int64)  # 0/1 (binary labels as link batches carry them, in float)
    key = np.stack([columns["src"], columns["dst"]] + ([columns["query"]] if "query" in columns else []), axis=1)
    _, first = np.unique(key, axis=0, return_index=True)  # sorted by (src, dst[, query]); padding repeats dropped
    columns = {k: v[first] for k, v in columns.items()}
    if edge_type is not None:
        columns["edge_type"] = np.asarray(edge_type)
    _write_npz(path, columns)
    return path, f"{len(first)} scored edges"


def _to_pinned(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as ``dtype`` in pinned host memory, copied without waiting (valid once the current stream gets there)."""
    if not t.is_cuda:
        return t.to(dtype)
    host = torch.empty(t.shape, dtype=dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp.npz")


def _save(path: Path, ids: list[np.ndarray], logits: list[np.ndarray], node_type: Optional[str] = None) -> Path:
    """Writes node ids (sorted, each once), logits, argmax class and its softmax probability, and the ids' node type
    where there is one; returns ``path``."""
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
    typed = {} if node_type is None else {"node_type": np.asarray(node_type)}
    _write_npz(path, dict(node_id=all_ids, logits=all_logits, pred=pred.astype(np.int64), prob=prob, **typed))
    return path


def _write_npz(path: Path, columns: dict[str, np.ndarray]) -> None:
    """``np.savez`` into a file beside ``path`` (its folder made first), renamed onto it once complete; on a write
    error (a full disk, a folder in the way) the partial file is removed and one line says what failed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        np.savez(_tmp(path), **columns)
        os.replace(_tmp(path), path)
    except OSError as exc:
        _tmp(path).unlink(missing_ok=True)
        raise RunEnvironmentError(exc.errno or errno.EIO, f"writing the predictions to {path} failed "
                                  f"({exc.strerror or exc}); nothing was written there") from exc  # fmt: skip
