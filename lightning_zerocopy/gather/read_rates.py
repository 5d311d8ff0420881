"""How fast one GPU reads random feature rows from where they may live: its own memory, a peer GPU, host memory.

:func:`measure_read_gbps` times the zero-copy row gather (the kernel the feature cache uses) over random row ids of
a source: a CUDA tensor of this GPU (local), one opened over CUDA IPC for it whose memory is on a peer GPU (peer),
or the registered host feature table (host). The ids cover the whole source, so the host figure includes the
address-translation cost of reads spread over a large table, as a real batch's misses are. The figure is bytes of
rows delivered per second, the median of a few timed gathers after a warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightning_zerocopy import ops

__all__ = ["ReadRates", "measure_read_gbps"]


@dataclass(frozen=True)
class ReadRates:
    """GB/s of random rows delivered into one GPU, by source (``nan`` where not measured).

    Attributes:
        local: from this GPU's memory.
        peer: from a peer GPU's memory (over NVLink or PCIe).
        host: from registered host memory (over PCIe).
    """

    local: float
    peer: float
    host: float

    @staticmethod
    def mean(rates: "list[ReadRates]") -> "ReadRates":
        """The per-source mean over ``rates`` (what every rank of a machine uses, so that all decide alike)."""

        def avg(values: list[float]) -> float:
            kept = [v for v in values if not math.isnan(v)]
            return sum(kept) / len(kept) if kept else math.nan

        return ReadRates(
            local=avg([r.local for r in rates]), peer=avg([r.peer for r in rates]), host=avg([r.host for r in rates])
        )

    def __str__(self) -> str:
        def fmt(v: float) -> str:
            return "n/a" if math.isnan(v) else f"{v:.0f}"

        return f"reads at {fmt(self.local)} GB/s local, {fmt(self.peer)} peer, {fmt(self.host)} host"


def measure_read_gbps(
    source: torch.Tensor, device: torch.device, num_reads: int = 1 << 17, repeats: int = 5, seed: int = 0
) -> float:
    """GB/s of ``num_reads`` random rows of ``source`` gathered into GPU memory of ``device`` (median of ``repeats``).

    Args:
        source: a 2-D contiguous table: a CUDA tensor on ``device`` (its memory may be a peer GPU's, opened for
            ``device``) or host memory registered for the GPU.
        device: the reading GPU.
        num_reads: rows per timed gather (drawn with replacement over all of ``source``, read in address order as
            the cache's sorted read does).
        repeats: timed gathers; the median is returned.
        seed: seed of the row ids.
    """
    if source.dim() != 2 or source.shape[0] == 0 or source.shape[1] == 0:
        raise ValueError(f"measure_read_gbps: `source` must be a non-empty 2-D table, got {tuple(source.shape)}")
    row_bytes = source.shape[1] * source.element_size()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, source.shape[0], (num_reads,), generator=generator).to(device)
    out = torch.empty((num_reads, source.shape[1]), dtype=source.dtype, device=device)
    times = []
    with torch.cuda.device(device):
        ops.gather_rows(source, ids, out, sort_ids=True)  # warm-up: the first launch pays one-time costs
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            ops.gather_rows(source, ids, out, sort_ids=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    seconds = sorted(times)[len(times) // 2]
    return num_reads * row_bytes / seconds / 1e9 if seconds > 0 else math.inf
