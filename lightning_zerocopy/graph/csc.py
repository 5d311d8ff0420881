"""The compressed graph: incoming edges of every node (CSC over ``edge_index[1]``).

Sampling walks each target's incoming edges, so messages flow neighbor -> target exactly as in PyG, also on
directed graphs. A :class:`CSCGraph` can live in ordinary memory, in shared memory that every local process
maps (:meth:`CSCGraph.share`, :meth:`CSCGraph.handle`), or in ``.npy`` files mapped from disk
(:meth:`CSCGraph.save`, :meth:`CSCGraph.load`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch
from tqdm.auto import tqdm

from lightning_zerocopy import ops
from lightning_zerocopy.graph.shared_memory import (
    NpyTensorHandle,
    SharedTensorHandle,
    TensorHandle,
    open_npy_memmap,
    save_npy,
    share_tensor,
)

__all__ = ["CSCGraph", "CSCGraphHandle"]

_FORMAT_VERSION = 1
_FIELDS = ("indptr", "indices", "edge_perm")
#: Builds of more edges than this (about a second or more) show a progress bar.
_PROGRESS_EDGES = 10_000_000


@dataclass(frozen=True)
class CSCGraphHandle:
    """Picklable name of a :class:`CSCGraph` held in shared memory or ``.npy`` files (no data)."""

    num_nodes: int
    indptr: TensorHandle
    indices: TensorHandle
    edge_perm: Optional[TensorHandle]

    def open(self) -> "CSCGraph":
        """Map the graph's memory in this process (no copy)."""
        return CSCGraph(
            indptr=self.indptr.open(),
            indices=self.indices.open(),
            edge_perm=None if self.edge_perm is None else self.edge_perm.open(),
            num_nodes=self.num_nodes,
            _handles=self,
        )

    def unlink(self) -> None:
        """Remove the names of the shared segments (``.npy`` files on disk are kept)."""
        for h in (self.indptr, self.indices, self.edge_perm):
            if isinstance(h, SharedTensorHandle):
                h.unlink()


@dataclass
class CSCGraph:
    """Incoming adjacency: the sources of edges into ``v`` are ``indices[indptr[v]:indptr[v + 1]]``.

    Attributes:
        indptr: int64, ``num_nodes + 1`` entries, ``indptr[0] == 0``, non-decreasing.
        indices: int32 (or int64 when node ids do not fit int32) source ids, sorted within each target.
        edge_perm: int64 position in the original edge list of every compressed edge (so ``edge_attr`` and
            PyG's ``e_id`` can be recovered), or ``None``.
        num_nodes: number of nodes.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: Optional[torch.Tensor]
    num_nodes: int
    _handles: Optional[CSCGraphHandle] = field(default=None, repr=False, compare=False)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def degree(self) -> torch.Tensor:
        """In-degree of every node (int64)."""
        return self.indptr[1:] - self.indptr[:-1]

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,
        num_nodes: Optional[int] = None,
        *,
        remove_self_loops: bool = False,
        remove_duplicates: bool = False,
    ) -> "CSCGraph":
        """Build from a PyG ``edge_index`` (``[2, E]``; messages flow ``edge_index[0] -> edge_index[1]``).

        Args:
            edge_index: ``[2, E]`` integer tensor on the CPU.
            num_nodes: number of nodes; default ``edge_index.max() + 1``.
            remove_self_loops: drop edges ``v -> v``.
            remove_duplicates: keep only the first (in input order) of repeated ``(src, dst)`` pairs.
        """
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            shape = tuple(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index)
            raise ValueError(f"`edge_index` must be a [2, num_edges] tensor, got {shape}")
        if edge_index.is_floating_point() or edge_index.is_complex() or edge_index.dtype == torch.bool:
            raise TypeError(f"`edge_index` must hold integer node ids, got {edge_index.dtype}")
        if edge_index.device.type != "cpu":
            raise ValueError(f"`edge_index` must be on the CPU, got {edge_index.device}")
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.numel() > 0 else 0
        src = edge_index[0].to(torch.int64).contiguous()
        dst = edge_index[1].to(torch.int64).contiguous()
        if src.numel() <= _PROGRESS_EDGES:
            csc = ops.build_csc(src, dst, int(num_nodes), remove_self_loops, remove_duplicates)
        else:  # one compiled call: the bar shows what runs and, when done, how long it took
            with tqdm(total=1, desc=f"building CSC ({num_nodes:,} nodes, {src.numel():,} edges)") as bar:
                csc = ops.build_csc(src, dst, int(num_nodes), remove_self_loops, remove_duplicates)
                bar.update(1)
        return cls(csc.indptr, csc.indices, csc.edge_perm, int(num_nodes))

    def validate(self) -> "CSCGraph":
        """Check the invariants; raise ``ValueError``/``TypeError`` naming the bad field. Returns ``self``."""
        if self.num_nodes < 0:
            raise ValueError(f"`num_nodes` must be >= 0, got {self.num_nodes}")
        for name in _FIELDS:
            t = getattr(self, name)
            if t is not None and t.dim() != 1:
                raise ValueError(f"`{name}` must be 1-D, got shape {tuple(t.shape)}")
        if self.indptr.dtype != torch.int64:
            raise TypeError(f"`indptr` must be int64, got {self.indptr.dtype}")
        if self.indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"`indices` must be int32 or int64, got {self.indices.dtype}")
        if self.indices.dtype == torch.int32 and self.num_nodes - 1 > torch.iinfo(torch.int32).max:
            raise TypeError(f"`indices` must be int64 for num_nodes={self.num_nodes}, got int32")
        if self.edge_perm is not None and self.edge_perm.dtype != torch.int64:
            raise TypeError(f"`edge_perm` must be int64, got {self.edge_perm.dtype}")
        if self.indptr.numel() != self.num_nodes + 1:
            raise ValueError(
                f"`indptr` must have num_nodes + 1 = {self.num_nodes + 1} entries, got {self.indptr.numel()}"
            )
        if int(self.indptr[0]) != 0:
            raise ValueError(f"`indptr[0]` must be 0, got {int(self.indptr[0])}")
        if int(self.indptr[-1]) != self.num_edges:
            raise ValueError(f"`indptr[-1]` must equal len(indices) = {self.num_edges}, got {int(self.indptr[-1])}")
        steps = self.indptr[1:] < self.indptr[:-1]
        if bool(steps.any()):
            v = int(steps.nonzero()[0])
            raise ValueError(f"`indptr` must be non-decreasing; it drops after node {v}")
        if self.num_edges > 0:
            lo, hi = int(self.indices.min()), int(self.indices.max())
            if lo < 0 or hi >= self.num_nodes:
                raise ValueError(f"`indices` must be in [0, {self.num_nodes}), got values in [{lo}, {hi}]")
        if self.edge_perm is not None and self.edge_perm.numel() != self.num_edges:
            raise ValueError(
                f"`edge_perm` must have len(indices) = {self.num_edges} entries, got {self.edge_perm.numel()}"
            )
        if self.edge_perm is not None and self.num_edges > 0 and int(self.edge_perm.min()) < 0:
            raise ValueError("`edge_perm` must hold non-negative edge positions")
        return self

    # ---- shared memory -------------------------------------------------------------------------------------

    def share(self) -> "CSCGraph":
        """Copy the tensors into shared memory; the returned graph has a :meth:`handle` for other processes.

        The caller owns the segments: once every local process has opened the handle, call :meth:`unlink`.
        """
        tensors, handles = {}, {}
        try:
            for name in _FIELDS:
                t = getattr(self, name)
                if t is None:
                    tensors[name], handles[name] = None, None
                    continue
                tensors[name], handles[name] = share_tensor(t, name=f"csc_{name}")
        except BaseException:
            for h in handles.values():
                if h is not None:
                    h.unlink()
            raise
        handle = CSCGraphHandle(self.num_nodes, handles["indptr"], handles["indices"], handles["edge_perm"])
        return CSCGraph(num_nodes=self.num_nodes, _handles=handle, **tensors)

    @property
    def is_shareable(self) -> bool:
        """Whether :meth:`handle` works (the graph lives in shared memory or ``.npy`` files)."""
        return self._handles is not None

    def handle(self) -> CSCGraphHandle:
        """Picklable handle that opens this graph's memory by name in another local process.

        Raises:
            ValueError: if the graph is in private memory; call :meth:`share` (or :meth:`load`) first.
        """
        if self._handles is None:
            raise ValueError("this CSCGraph lives in private memory: call .share() first to get a handle")
        return self._handles

    def unlink(self) -> None:
        """Remove the names of this graph's shared segments (mappings stay valid until dropped)."""
        if self._handles is not None:
            self._handles.unlink()

    # ---- disk cache ----------------------------------------------------------------------------------------

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the graph to directory ``path`` as ``.npy`` files plus ``meta.json``."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        for name in _FIELDS:
            t = getattr(self, name)
            if t is not None:
                save_npy(t, root / f"{name}.npy")
            elif (root / f"{name}.npy").exists():
                (root / f"{name}.npy").unlink()
        meta = {
            "format_version": _FORMAT_VERSION,
            "num_nodes": self.num_nodes,
            "has_edge_perm": self.edge_perm is not None,
        }
        tmp = root / f"meta.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, root / "meta.json")  # written last: its presence marks a complete cache

    @classmethod
    def load(cls, path: Union[str, os.PathLike], *, mmap: bool = True) -> "CSCGraph":
        """Read a graph written by :meth:`save`.

        Args:
            path: the directory given to :meth:`save`.
            mmap: map the files copy-on-write (no read up front; pages shared through the page cache, and
                the graph gets a :meth:`handle` that opens the same files). ``False`` reads them into memory.
        """
        root = Path(path)
        meta_path = root / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"no saved CSCGraph at {root} (missing meta.json)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format_version") != _FORMAT_VERSION:
            raise ValueError(f"{root} holds CSCGraph format {meta.get('format_version')}, expected {_FORMAT_VERSION}")
        handles = {
            name: NpyTensorHandle(str(root / f"{name}.npy"))
            if name != "edge_perm" or meta["has_edge_perm"]
            else None
            for name in _FIELDS
        }
        handle = CSCGraphHandle(int(meta["num_nodes"]), handles["indptr"], handles["indices"], handles["edge_perm"])
        if mmap:
            return handle.open()
        tensors = {name: None if h is None else open_npy_memmap(h.path).clone() for name, h in handles.items()}
        return cls(num_nodes=handle.num_nodes, **tensors)
