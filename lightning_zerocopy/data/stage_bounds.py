"""What each stage of a batch build could cost at best: the bounds the pipeline's stage split is compared with.

* The gather moves feature rows over PCIe, so its bound is the rows' bytes over the link's bandwidth:
  :func:`h2d_bandwidth` measures it once per process and device (a contiguous pinned host-to-device copy timed with
  CUDA events), and the pipeline producer divides each batch's gathered bytes by it (``data/gather_bound_ms``).
* Sampling is bound by its kernels: what it takes on an otherwise idle GPU is :func:`time_sampling`, which times
  :meth:`BatchBuilder.sample_batch <lightning_zerocopy.data.batch.BatchBuilder.sample_batch>` alone over a number of
  batches (a benchmark calls it in a row of its own, before or after training, never beside it).

Neither runs on a hot path: each synchronizes the device it measures.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Union

import torch

__all__ = ["h2d_bandwidth", "time_sampling"]

_log = logging.getLogger(__name__)
_H2D: dict[tuple[int, int], Optional[float]] = {}  # (device index, bytes) -> GB/s (None: the measurement failed)
_H2D_LOCK = threading.Lock()
_MiB = 1 << 20


def h2d_bandwidth(
    device: Union[torch.device, int, None] = None, nbytes: int = 256 * _MiB, repeats: int = 3
) -> Optional[float]:
    """PCIe host-to-device bandwidth in GB/s (1e9 bytes/s), measured once per process and device, then cached.

    A contiguous copy of ``nbytes`` from pinned host memory (pinned for the measurement only: registered, then
    unregistered) into a GPU buffer, on a stream of its own: one copy to warm up, then the fastest of ``repeats``
    copies, each timed with CUDA events. Synchronizes that stream (call it at start-up, not per batch).

    Args:
        device: the CUDA device (index or ``torch.device``); ``None``: the current one.
        nbytes: bytes per copy (256 MiB: the copy engines' asymptotic rate, about 1% above a 64 MiB copy's).
        repeats: timed copies.

    Returns:
        GB/s, or ``None`` when it cannot be measured (no CUDA device, or pinning failed: logged once).
    """
    if not torch.cuda.is_available():
        return None
    if isinstance(device, torch.device):
        device = device.index
    index = torch.cuda.current_device() if device is None else int(device)
    key = (index, int(nbytes))
    with _H2D_LOCK:
        if key not in _H2D:
            _H2D[key] = _measure_h2d(index, int(nbytes), max(1, int(repeats)))
        return _H2D[key]


def _measure_h2d(index: int, nbytes: int, repeats: int) -> Optional[float]:
    from lightning_zerocopy.graph.host_registration import register_host_tensor

    try:
        with torch.cuda.device(index):
            host = torch.full((nbytes,), 7, dtype=torch.uint8)  # not all-zero pages
            registration = register_host_tensor(host, name="PCIe bandwidth probe")
            try:
                source = registration.tensor
                target = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
                stream = torch.cuda.Stream(index)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                best = float("inf")
                with torch.cuda.stream(stream):
                    for attempt in range(repeats + 1):
                        start.record(stream)
                        target.copy_(source, non_blocking=True)
                        end.record(stream)
                        end.synchronize()
                        if attempt > 0:  # the first copy warms up
                            best = min(best, start.elapsed_time(end) / 1e3)
                del target
            finally:
                registration.close()  # after the copies: end.synchronize() above waited for each
    except RuntimeError as exc:
        _log.warning("could not measure the PCIe host-to-device bandwidth on cuda:%d (%s); no gather bound", index, exc)
        return None
    return nbytes / best * 1e-9 if best > 0 else None


def time_sampling(
    builder: Any, plan: Any, batches: int = 20, warmup: int = 3, epoch: int = 0
) -> float:
    """Milliseconds per batch that ``builder.sample_batch`` takes on its own: the sampling stage's bound.

    Samples ``warmup`` batches, then times ``batches`` more back to back (plan steps ``0, 1, ...``, wrapping around
    the epoch): for a GPU builder the span between CUDA events on the current stream around the timed batches (the
    GPU time of sampling alone, on a GPU the caller keeps otherwise idle), for a CPU builder the host time. The
    samples are dropped.

    Args:
        builder: a :class:`~lightning_zerocopy.data.batch.BatchBuilder` (opened here if it is not).
        plan: its batch plan (``plan.item(epoch, step)``, ``len(plan)`` steps), e.g. ``ZeroCopyDataModule.plan("train")``.
        batches: batches timed.
        warmup: batches sampled first, untimed (the GPU sampler captures a CUDA graph at a shape's second batch).
        epoch: the plan's epoch.

    Raises:
        ValueError: ``batches`` < 1, ``warmup`` < 0, or an empty plan.
    """
    if batches < 1 or warmup < 0:
        raise ValueError(f"`batches` must be >= 1 and `warmup` >= 0, got {batches} and {warmup}")
    steps = len(plan)
    if steps == 0:
        raise ValueError("`plan` has no batches to sample")
    if not builder.is_open:
        builder.open()
    items = [plan.item(epoch, step % steps) for step in range(warmup + batches)]
    for item in items[:warmup]:
        builder.sample_batch(item)
    if not builder.on_gpu:
        t0 = time.perf_counter()
        for item in items[warmup:]:
            builder.sample_batch(item)
        return 1e3 * (time.perf_counter() - t0) / batches
    device = builder.device
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream.synchronize()  # the warm-up's work is not timed
        start.record(stream)
        for item in items[warmup:]:
            builder.sample_batch(item)
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / batches
