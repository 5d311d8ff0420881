"""Exact layer-wise inference over every node: one layer at a time, each destination node's output from all its
in-neighbors' previous-layer outputs (PyG's ``BasicGNN.inference``, with host-memory features and our samplers).

For each layer, the destination nodes of every node type the layer outputs are cut into batches (at most
``batch_size`` nodes and ``max_batch_edges`` in-edges each, so a batch's GPU working set is bounded); each batch is
the one-hop full neighborhood (fanout ``-1``) sampled by the DataModule's :class:`~lightning_zerocopy.data.batch.BatchBuilder`
on its placement. Layer 0 reads ``x`` through the builder's gather (the host feature tables, zero-copy on a GPU, cast
to ``x_dtype``); layer ``l > 0`` reads the previous layer's :class:`~lightning_zerocopy.data.layer_tables.LayerTable` s
the same way (a new host table per layer, registered for zero-copy on a GPU), so host memory holds the features and at
most two layers of outputs (:attr:`LayerwiseResult.live_layers` records it). The model runs one layer on each batch
(:class:`LayerwiseModule`, the contract of :mod:`lightning_zerocopy.models.layerwise`) and the rows of the batch's
destination nodes go to that layer's table.

Several ranks of one machine deal each layer's batches round-robin and write their rows into the one shared table; a
barrier ends every layer. Batches are cut the same way whatever the rank count, so every node's rows are computed in
the same batch, and the tables hold the same bits as one rank's (with deterministic kernels).

Ids: tables are indexed by the dataset's node ids (a node-ordered host copy maps the sampled internal ids back before
reading a table), so the exported embeddings need no permutation. A last layer may run on the predicted nodes only
(``targets``): its table's row ``i`` is then node ``targets[type][i]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData
from tqdm.auto import tqdm

from lightning_zerocopy.data.assemble import move_batch
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.layer_tables import LayerTable, LocalRanks, TableStorage
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions
from lightning_zerocopy.data.layerwise_plan import LayerwiseModule, batch_bounds, layer_index, layer_outputs
from lightning_zerocopy.data.plan import PlanItem
from lightning_zerocopy.gather.host_table import feature_dtype_of
from lightning_zerocopy.graph.schema import NODE
from lightning_zerocopy.options import RecipeError

__all__ = ["LayerStats", "LayerwiseModule", "LayerwisePass", "LayerwiseResult", "batch_bounds"]

_KEY = "data.init_args.layerwise."
_PROBE_WINDOW = 4096  # the probe node: the fewest in-edges among the first nodes of a destination list


@dataclass(frozen=True)
class LayerStats:
    """What one rank did in one layer: wall time (its device synchronized), batches, destination nodes, sampled
    edges, the bytes of input rows it read (features at layer 0, the previous layer's table after), and the host
    seconds spent in the sampler's calls (a CPU sampler's whole work, which the GPU's work of earlier batches
    overlaps; for a GPU sampler its launches and count readbacks): near ``seconds``, the sampler bounds the layer."""

    layer: int
    seconds: float
    batches: int
    dst_nodes: int
    edges: int
    bytes_read: int
    sample_seconds: float = 0.0


@dataclass
class LayerwiseResult:
    """The last layer's tables, what was exported, and the figures.

    Attributes:
        tables: the last layer's table of each node type it ran on.
        node_ids: per type, the node of each table row (``None``: row ``i`` is node ``i``).
        embeddings: the ``.npy`` file of each node type's exported embeddings.
        stats: this rank's :class:`LayerStats`, one per layer.
        live_layers: per layer, the layers whose tables were mapped when it ended (at most it and the one before).
    """

    tables: dict[str, LayerTable]
    node_ids: dict[str, Optional[torch.Tensor]]
    embeddings: dict[str, Path] = field(default_factory=dict)
    stats: list[LayerStats] = field(default_factory=list)
    live_layers: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


@dataclass(frozen=True)
class _TypedItem(PlanItem):
    """A plan item seeding one node type of a typed graph (any type, not only the input type)."""

    node_type: str = ""

    @property
    def typed_seeds(self) -> Optional[dict[str, torch.Tensor]]:
        return {self.node_type: self.seed_ids}


class LayerwisePass:
    """Runs ``model`` layer by layer over every node (see the module docstring).

    Args:
        builder: the DataModule's one-hop builder (fanout ``-1`` per edge type), open on its resources.
        model: a :class:`LayerwiseModule` in eval mode, on ``device``.
        options: batch size, edge budget, storage, dtype (:class:`~lightning_zerocopy.data.layerwise_options.LayerwiseOptions`).
        device: where the model runs.
        ranks: the processes of this machine sharing the work (default: this one).
        targets: the last layer's destination nodes per node type (e.g. the predicted split); ``None``: every node of
            every type it outputs.
        embeddings_path: with ``options.embeddings``, the ``.npy`` file (untyped graph) or folder (typed:
            ``embeddings.<type>.npy``) of the exported layer (default: ``options.embeddings_path``).
        progress: a progress bar per layer (on local rank 0).

    Raises:
        TypeError / ValueError: a model whose ``layerwise_layers()`` does not fit the graph, or options that do not.
    """

    def __init__(self, builder: BatchBuilder, model: LayerwiseModule, options: LayerwiseOptions, *,
                 device: torch.device, ranks: Optional[LocalRanks] = None,
                 targets: Optional[Mapping[str, torch.Tensor]] = None, embeddings_path: Optional[Path] = None,
                 progress: bool = False) -> None:  # fmt: skip
        if builder.resources is None:
            raise ValueError("open the builder on the DataModule's resources first")
        self.builder, self.model, self.options, self.device = builder, model, options, torch.device(device)
        self.ranks = ranks or LocalRanks()
        self.schema, self.host = builder.handles.schema, builder.resources.host
        self.layers = layer_outputs(model, self.schema)
        self.targets = None if targets is None else {t: torch.as_tensor(ids, dtype=torch.int64).unique()
                                                     for t, ids in targets.items()}  # fmt: skip
        self.embeddings_layer = layer_index(options.embeddings, len(self.layers))
        self.embeddings_path = embeddings_path if embeddings_path is not None else options.embeddings_path
        self.progress = progress and self.ranks.local_rank == 0
        self._dtype = feature_dtype_of(options.dtype, _KEY + "dtype")
        self._cum: dict[tuple[str, bool], np.ndarray] = {}
        self._sample_seconds = 0.0  # host time in the sampler, summed over a layer's batches
        self._check()

    # ---- the pass --------------------------------------------------------------------------------------------

    def run(self) -> LayerwiseResult:
        """Every layer in turn; returns the last layer's tables (the caller closes them)."""
        with torch.inference_mode():
            shapes = self._shapes()
            files = self._embedding_files(shapes)
            inputs: dict[str, LayerTable] = {}
            opened: list[LayerTable] = []  # every table of the pass, closed on failure
            result = LayerwiseResult({}, {}, embeddings=files)
            try:
                for layer in range(len(self.layers)):
                    dst = self._destinations(layer)
                    outputs = self._tables(layer, dst, shapes[layer], inputs, files)
                    opened += outputs.values()
                    result.stats.append(self._run_layer(layer, dst, inputs, outputs))
                    self.ranks.barrier(f"lightning_zerocopy.layerwise.layer{layer}")
                    alive = {t.layer for t in opened if not t.closed}
                    result.live_layers.append((layer, tuple(sorted(alive))))
                    if layer == self.embeddings_layer and self.ranks.local_rank == 0:
                        for table in outputs.values():
                            table.finish()
                    for table in inputs.values():
                        table.close()
                    inputs = outputs
            except BaseException:
                for table in opened:
                    table.close()
                raise
            result.tables, result.node_ids = inputs, dict(self._destinations(len(self.layers) - 1))
            return result

    def _run_layer(self, layer: int, dst: dict[str, Optional[torch.Tensor]], inputs: dict[str, LayerTable],
                   outputs: dict[str, LayerTable]) -> LayerStats:  # fmt: skip
        start = time.perf_counter()
        work = []
        for node_type, ids in dst.items():
            bounds = self._bounds(node_type, ids)
            mine = range(self.ranks.local_rank, len(bounds) - 1, self.ranks.local_world_size)
            work += [(node_type, ids, bounds[k], bounds[k + 1]) for k in mine]
        read_before = sum(t.bytes_read for t in inputs.values())
        self._sample_seconds = 0.0
        edges = nodes = features = 0
        desc = f"layer {layer + 1}/{len(self.layers)}"
        for node_type, ids, lo, hi in tqdm(work, desc=desc, unit="batch", disable=not self.progress):
            batch_ids = torch.arange(lo, hi) if ids is None else ids[lo:hi]
            block, read = self._block(layer, node_type, batch_ids, inputs)
            outputs[node_type].write(lo, self._rows(layer, block, node_type, hi - lo))
            edges += sum(int(s.edge_index.shape[1]) for s in block.edge_stores)
            nodes, features = nodes + hi - lo, features + read
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the rows are in the tables before other ranks read them
        read = features + sum(t.bytes_read for t in inputs.values()) - read_before
        return LayerStats(layer, time.perf_counter() - start, len(work), nodes, edges, read, self._sample_seconds)

    # ---- one batch -------------------------------------------------------------------------------------------

    def _block(self, layer: int, node_type: str, ids: torch.Tensor, inputs: Mapping[str, LayerTable],
               zeros: Optional[Mapping[str, tuple[int, torch.dtype]]] = None) -> tuple[Union[Data, HeteroData], int]:  # fmt: skip
        """The one-hop block of destination nodes ``ids`` and the feature bytes it read: ``x`` from the features
        (layer 0), from the previous layer's tables, or zeros of the given widths (a shape probe)."""
        typed = self.schema.is_typed
        item = (_TypedItem(ids, ids, 0, 0, 0, 0, node_type=node_type) if typed else PlanItem(ids, ids, 0, 0, 0, 0))
        start = time.perf_counter()
        sampled = self.builder.sample_batch(item)
        self._sample_seconds += time.perf_counter() - start
        read = 0
        if layer == 0:
            block = self.builder.gather_batch(sampled)
            for t, table in self.host.tables.items():
                x = block.x if not typed else block[t].x
                read += int(x.shape[0]) * table.row_bytes
        else:
            block = self._table_block(sampled.sample, inputs, zeros)
        if typed:
            block[node_type].batch_size = int(ids.numel())
        return move_batch(block, self.device), read

    def _table_block(self, sample: Any, inputs: Mapping[str, LayerTable],
                     zeros: Optional[Mapping[str, tuple[int, torch.dtype]]]) -> Union[Data, HeteroData]:  # fmt: skip
        def rows(node_type: str, n_id: torch.Tensor) -> Optional[torch.Tensor]:
            if zeros is not None:
                shape = zeros.get(node_type)
                return None if shape is None else torch.zeros(n_id.numel(), shape[0], dtype=shape[1], device=n_id.device)
            table = inputs.get(node_type)
            return None if table is None else table.gather(n_id, n_id.device)

        if not self.schema.is_typed:
            n_id = self._original_ids(sample.n_id)
            return Data(x=rows(NODE, n_id), edge_index=sample.edge_index, n_id=n_id, batch_size=sample.batch_size)
        data = HeteroData()
        for node_type, n_id in sample.n_id.items():
            store, x = data[node_type], rows(node_type, n_id)
            store.n_id = n_id
            if x is not None:
                store.x = x
            else:
                store.num_nodes = int(n_id.numel())
        for edge_type, edge_index in sample.edge_index.items():
            data[edge_type].edge_index = edge_index
        return data

    def _original_ids(self, n_id: torch.Tensor) -> torch.Tensor:
        """Internal (node-ordered) ids as the dataset's, which index the layer tables."""
        if self.host.order is None:
            return n_id
        resources = self.builder.resources
        assert resources is not None
        order = resources.node_order() if n_id.is_cuda else self.host.order
        return torch.index_select(order, 0, n_id).to(torch.int64)  # type: ignore[arg-type]

    def _rows(self, layer: int, block: Any, node_type: str, size: int) -> torch.Tensor:
        out = self.model.layerwise_step(layer, block)
        name = type(self.model).__name__
        if isinstance(out, Mapping):
            if node_type not in out:
                raise ValueError(f"{name}.layerwise_step({layer}, block) returned rows of {sorted(out)}, not of "
                                 f"{node_type!r}, which layerwise_layers() says layer {layer} outputs")  # fmt: skip
            out = out[node_type]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] < size:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"{name}.layerwise_step({layer}, block) must return a [nodes, width] tensor with a row "
                             f"for each of the block's first batch_size ({size}) nodes, got {got}")  # fmt: skip
        return out[:size]

    # ---- the plan of a pass ----------------------------------------------------------------------------------

    def _destinations(self, layer: int) -> dict[str, Optional[torch.Tensor]]:
        """Each output type's destination nodes (``None``: all of them), types without nodes left out."""
        if layer == len(self.layers) - 1 and self.targets is not None:
            return dict(self.targets)  # type: ignore[arg-type]
        return {t: None for t in self.layers[layer] if self.host.num_nodes[t] > 0}

    def _cum_degrees(self, node_type: str, ids: Optional[torch.Tensor]) -> np.ndarray:
        """In-edges of the destination list, cumulated, over every edge type into ``node_type``."""
        key = (node_type, ids is None)
        if ids is None and key in self._cum:
            return self._cum[key]
        count = self.host.num_nodes[node_type]
        into = [g for et, g in self.host.graphs.items() if et[2] == node_type]
        if ids is None and len(into) == 1:
            cum = into[0].indptr[: count + 1].numpy()  # the CSC pointer is that sum already (no copy)
        else:
            degree = np.zeros(count, dtype=np.int64)
            for graph in into:
                indptr = graph.indptr[: count + 1].numpy()
                degree += indptr[1:] - indptr[:-1]
            if ids is not None:
                degree = degree[ids.numpy()]
            cum = np.concatenate([[0], np.cumsum(degree)])
        if ids is None:
            self._cum[key] = cum
        return cum

    def _bounds(self, node_type: str, ids: Optional[torch.Tensor]) -> list[int]:
        return batch_bounds(self._cum_degrees(node_type, ids), self.options.batch_size, self.options.max_batch_edges)

    def _shapes(self) -> list[dict[str, tuple[int, torch.dtype]]]:
        """Each layer's output width and dtype per type, from one small block per (layer, type): the real features
        at layer 0, zeros of the previous layer's widths after (the same on every rank, before any table exists)."""
        shapes: list[dict[str, tuple[int, torch.dtype]]] = []
        for layer in range(len(self.layers)):
            shape = {}
            for node_type, ids in self._destinations(layer).items():
                cum = self._cum_degrees(node_type, ids)
                window = min(len(cum) - 1, _PROBE_WINDOW)
                pick = int(np.argmin(cum[1 : window + 1] - cum[:window]))
                probe = torch.tensor([pick if ids is None else int(ids[pick])])
                block, _ = self._block(layer, node_type, probe, {}, shapes[-1] if shapes else None)
                rows = self._rows(layer, block, node_type, 1)
                shape[node_type] = (int(rows.shape[1]), rows.dtype)
            shapes.append(shape)
        return shapes

    def _tables(self, layer: int, dst: dict[str, Optional[torch.Tensor]], shape: dict[str, tuple[int, torch.dtype]],
                inputs: Mapping[str, LayerTable], files: Mapping[str, Path]) -> dict[str, LayerTable]:  # fmt: skip
        rows = {t: self.host.num_nodes[t] if ids is None else int(ids.numel()) for t, ids in dst.items()}
        nbytes = sum(rows[t] * shape[t][0] * self._dtype.itemsize for t in dst)
        storage = self._storage(layer, nbytes, sum(t.nbytes for t in inputs.values() if t.storage == "gpu"))
        tables: dict[str, LayerTable] = {}
        try:
            for node_type in dst:
                width, compute = shape[node_type]
                tables[node_type] = LayerTable.create(rows[node_type], width, self._dtype, storage, self.ranks,
                                                      layer=layer, node_type=node_type, compute_dtype=compute,
                                                      device=self.device, path=files.get(node_type))  # fmt: skip
        except BaseException:
            for table in tables.values():
                table.close()
            raise
        return tables

    def _storage(self, layer: int, nbytes: int, gpu_inputs: int) -> TableStorage:
        if layer == self.embeddings_layer:
            return "file"
        choice = self.options.storage
        if choice != "auto":
            return choice  # type: ignore[return-value]
        if self.device.type != "cuda" or self.ranks.local_world_size > 1:
            return "host"
        free, _ = torch.cuda.mem_get_info(self.device)
        return "gpu" if nbytes + gpu_inputs <= free // 2 else "host"

    def _embedding_files(self, shapes: list[dict[str, tuple[int, torch.dtype]]]) -> dict[str, Path]:
        layer = self.embeddings_layer
        if layer is None:
            return {}
        if self.embeddings_path is None:
            raise ValueError(f"{_KEY}embeddings needs {_KEY}embeddings_path (the file, or a typed graph's folder)")
        path = Path(self.embeddings_path)
        if not self.schema.is_typed:
            return {NODE: path}
        return {t: path / f"embeddings.{t}.npy" for t in shapes[layer]}

    def _check(self) -> None:
        fanouts = self.builder.fanouts.values() if self.schema.is_typed else [self.builder.fanouts]
        if any(list(f) != [-1] for f in fanouts):
            raise ValueError(f"layer-wise inference samples one hop with every in-neighbor: the builder's fanouts "
                             f"must be [-1] per edge type, got {self.builder.fanouts}")  # fmt: skip
        if self.options.storage == "gpu" and (self.device.type != "cuda" or self.ranks.local_world_size > 1):
            raise RecipeError(f"{_KEY}storage: gpu keeps every layer's outputs in one GPU's memory, which needs a "
                              "one-rank run on a GPU; set it to host (or auto)")  # fmt: skip
        last = self.layers[-1]
        for node_type in self.targets or {}:
            if node_type not in last:
                raise RecipeError(f"{type(self.model).__name__}'s last layer outputs {list(last)}, not {node_type!r}, "
                                  "whose predictions the run asks for")  # fmt: skip
        if self.embeddings_layer == len(self.layers) - 1 and self.targets is not None:
            raise ValueError("the exported last layer needs every node: pass targets=None")
