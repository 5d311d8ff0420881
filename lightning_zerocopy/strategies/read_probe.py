"""Measuring, at setup, how fast each GPU reads feature rows locally, from a peer GPU and from host memory.

A collective over the job's default process group (every rank calls :func:`probe_read_rates`): each rank fills a
probe buffer on its GPU with random rows, the ranks swap the buffers' CUDA IPC handles, and each rank times random-row
gathers from its own buffer, from the next rank of its machine (when the two GPUs have peer access) and from the
registered host feature table (:func:`~lightning_zerocopy.gather.read_rates.measure_read_gbps`). A barrier keeps
every buffer alive until its readers are done. ``cache_policy: auto`` compares replicate and clique with these
rates (:mod:`~lightning_zerocopy.strategies.cache_cost`). It takes well under a second.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.distributed as dist

from lightning_zerocopy.gather.read_rates import ReadRates, measure_read_gbps
from lightning_zerocopy.graph.cuda_ipc import export_cuda_tensor

__all__ = ["probe_read_rates"]

#: Bytes of each rank's probe buffer (its rows are read at random, as a shard's would be).
PROBE_BYTES = 256 << 20


def probe_read_rates(
    host_table: torch.Tensor,
    device: torch.device,
    node_rank: int,
    local_rank: int,
    peer_access: Optional[list[list[bool]]],
    probe_rows: Optional[int] = None,
) -> dict[int, ReadRates]:
    """Every rank's read rates, by global rank (the same dict on every rank). A collective.

    Args:
        host_table: the feature table in host memory, registered for ``device``.
        device: this rank's GPU.
        node_rank, local_rank: where this rank runs.
        peer_access: this machine's peer-access matrix over its local ranks (``None`` on ranks other than local
            rank 0: the matrix is exchanged here).
        probe_rows: rows of the probe buffer (default: :data:`PROBE_BYTES` worth, at most the table's rows).
    """
    row_bytes = host_table.shape[1] * host_table.element_size()
    rows = probe_rows or max(1, min(host_table.shape[0], PROBE_BYTES // max(row_bytes, 1)))
    generator = torch.Generator(device=device).manual_seed(1234 + local_rank)
    probe = torch.randn((rows, host_table.shape[1]), generator=generator, device=device).to(host_table.dtype)
    mine = (node_rank, local_rank, export_cuda_tensor(probe), peer_access)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    machine = sorted((e for e in everyone if e[0] == node_rank), key=lambda e: e[1])
    matrix = next((e[3] for e in machine if e[3] is not None), None)
    position = [e[1] for e in machine].index(local_rank)
    target = _next_peer(position, matrix)
    local = measure_read_gbps(probe, device)
    peer = math.nan
    if target is not None:
        opened = machine[target][2].open(device)
        peer = measure_read_gbps(opened, device)
        torch.cuda.synchronize(device)
        del opened
    host = measure_read_gbps(host_table, device)
    rates: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rates, (dist.get_rank(), ReadRates(local=local, peer=peer, host=host)))
    dist.barrier()  # every reader of a probe buffer is done with it before its owner frees it
    del probe
    return dict(rates)


def _next_peer(position: int, matrix: Optional[list[list[bool]]]) -> Optional[int]:
    """The next position after ``position`` (cyclically) whose GPU this one and that one can read both ways."""
    if matrix is None:
        return None
    n = len(matrix)
    for step in range(1, n):
        other = (position + step) % n
        if matrix[position][other] and matrix[other][position]:
            return other
    return None
