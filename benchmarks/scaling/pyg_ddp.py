"""PyG's ``NeighborLoader`` as its users run it under Lightning's DDP: the baseline rows of ``benchmarks.scaling``, on a
homogeneous ``Data`` or a ``HeteroData`` alike."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch

__all__ = ["pyg_ddp_datamodule", "rank_share"]


def rank_share(seeds: torch.Tensor, seed: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's share of the training seeds: one seeded permutation of ``seeds``, every ``world_size``-th entry
    from ``rank`` (PyG's multi-GPU examples split them so); disjoint over the ranks, sizes differing by at most one."""
    order = torch.randperm(seeds.numel(), generator=torch.Generator().manual_seed(seed))
    return seeds[order][rank::world_size]


def pyg_ddp_datamodule(graph: Callable[[], Any], seeds: torch.Tensor, args: argparse.Namespace, fanouts: list[int],
                       batch_size: int, input_type: Optional[str] = None,
                       transform_sampler_output: Optional[Callable[[Any], Any]] = None,
                       **attributes: Any) -> pl.LightningDataModule:  # fmt: skip
    """A LightningDataModule of PyG ``NeighborLoader``s: each rank samples its :func:`rank_share` of ``seeds`` (of
    ``input_type`` on a ``HeteroData``), ``args.pyg_workers`` loader processes per rank, pinned batches,
    ``drop_last``, shuffled.

    Args:
        graph: makes the ``Data`` or ``HeteroData`` (called in ``train_dataloader``, once the rank is known).
        seeds: the training node ids (of ``input_type``).
        args: ``pyg_workers`` and ``seed``.
        fanouts: neighbors per hop (for every edge type on a ``HeteroData``).
        batch_size: seeds per batch per rank.
        input_type: the seeds' node type on a ``HeteroData``; ``None`` on a homogeneous ``Data``.
        transform_sampler_output: passed to ``NeighborLoader`` (the homogeneous rows add per-hop counts with it).
        **attributes: set on the DataModule (e.g. ``num_features``, ``num_classes`` for a model that reads them).

    Raises:
        RowUnavailable: neither pyg-lib nor torch-sparse imports (PyG's ``NeighborLoader`` needs one); raised here,
            before any rank starts, so the run fails with that one line.
    """
    from benchmarks.common.pyg import pyg_sampling_backends

    pyg_sampling_backends("NeighborLoader")

    class PyGData(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            from torch_geometric.loader import NeighborLoader

            share = rank_share(seeds, args.seed, self.trainer.global_rank, self.trainer.world_size)
            workers = int(args.pyg_workers)
            return NeighborLoader(graph(), num_neighbors=list(fanouts), input_nodes=share if input_type is None
                                  else (input_type, share), batch_size=batch_size, shuffle=True, drop_last=True,
                                  num_workers=workers, pin_memory=True, persistent_workers=workers > 0,
                                  transform_sampler_output=transform_sampler_output)  # fmt: skip

    dm = PyGData()
    for name, value in attributes.items():
        setattr(dm, name, value)
    return dm
