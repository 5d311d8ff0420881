"""Batch pipelines: build mini-batches ahead of the trainer, in a worker process or a thread.

* :mod:`.slots` — the ring of preallocated batch buffers shared once with the producer;
* :mod:`.producer` / :mod:`.client` — the producer loop and the trainer side of their small protocol; :mod:`.channel`
  — the producer's channel and its closed error; :mod:`.hybrid_ahead` — the producer's hybrid sampling (batches
  sampled ahead on several devices); :mod:`.cache_report` — a worker producer's feature-cache counters;
* :mod:`.lookahead` — the producer's sampling thread (sample ``t + 2`` while gathering ``t + 1``);
* :mod:`.worker` — the worker process (CUDA IPC, optional MPS share); :mod:`.in_process` — a producer thread
  with a side CUDA stream;
* :mod:`.mps` — the CUDA MPS control daemon and its supervisor; :mod:`.mps_launcher` — starting it for a job
  before CUDA (and the command-line launcher); :mod:`.cuda_probe` — has this process initialized the driver?
* :mod:`.sm_share` — green-context streams: an SM share for the in-process producer;
* :mod:`.share_choice` / :mod:`.share_auto` — the worker's MPS share: the rule, and one worker per share of the
  ladder while training chooses one;
* :mod:`.session` — the producers of one trainer run (what ``PipelineCallback`` delegates to).

Importing this package starts nothing (no process, no daemon, no CUDA context) and imports neither PyG nor the
CUDA-initializing parts of the stack: ``import torch_geometric`` initializes the CUDA driver, after which a
process can no longer become an MPS client, so :mod:`.mps` must be importable before it. The classes below are
imported on first access.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Mapping, Optional

import torch

from lightning_zerocopy._lazy import lazy_exports

if TYPE_CHECKING:
    from lightning_zerocopy.pipeline.client import PipelineClient

_LAZY = {
    "CacheReport": "lightning_zerocopy.pipeline.client",
    "PipelineClient": "lightning_zerocopy.pipeline.client",
    "PipelineError": "lightning_zerocopy.pipeline.client",
    "PipelineStats": "lightning_zerocopy.pipeline.client",
    "SlotLayout": "lightning_zerocopy.pipeline.slots",
    "SlotRing": "lightning_zerocopy.pipeline.slots",
    "capacity_bound": "lightning_zerocopy.pipeline.slots",
    "BatchSource": "lightning_zerocopy.pipeline.source",
    "PipelineSession": "lightning_zerocopy.pipeline.session",
}

__all__ = [*_LAZY, "start_pipeline"]


__getattr__ = lazy_exports(__name__, _LAZY)


def start_pipeline(
    mode: str,
    depth: int = 2,
    device: torch.device | str = "cpu",
    worker_env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    lookahead: bool = True,
    green_context_percent: Optional[int] = None,
) -> PipelineClient:
    """Start a producer (``mode="worker"``: a process; ``"in_process"``: a thread) and return its client.

    Args:
        mode: ``"worker"`` or ``"in_process"``.
        depth: slots per loader (2 = ping-pong).
        device: where slots live (a CUDA device, or CPU for shared host memory).
        worker_env: environment set in the worker process before it touches CUDA.
        timeout: seconds to wait for one batch from a live producer before raising (``None``: derived from the
            measured build times, :mod:`~lightning_zerocopy.pipeline.batch_timeout`).
        lookahead: three stages: sample batch ``t + 2`` while gathering ``t + 1`` (two-stage sources).
        green_context_percent: ``in_process`` on a GPU only: run the producer's kernels on green-context
            streams limited to this share of the SMs (:mod:`.sm_share`). Warns once and runs without a share
            where green contexts are unavailable.
    """
    device = torch.device(device)
    if green_context_percent is not None and mode != "in_process":
        raise ValueError("a green-context SM share is for mode='in_process' (the worker process uses MPS)")
    if mode == "worker":
        from lightning_zerocopy.pipeline.worker import WorkerTransport

        transport = WorkerTransport(device, env=worker_env, lookahead=lookahead)
    elif mode == "in_process":
        from lightning_zerocopy.pipeline.in_process import ThreadTransport

        share = _green_share(device, green_context_percent) if green_context_percent is not None else None
        transport = ThreadTransport(device, lookahead=lookahead, sm_share=share)
    else:
        raise ValueError(f"PipelineCallback(mode=...) must be 'worker', 'in_process' or 'auto', got {mode!r}")
    from lightning_zerocopy.pipeline.client import PipelineClient

    return PipelineClient(transport, depth=depth, device=device, timeout=timeout)


def _green_share(device: torch.device, percent: int):
    """Green-context streams for the in-process producer, or ``None`` (with a warning) where unavailable."""
    from lightning_zerocopy.pipeline.sm_share import GreenShare, SMShareUnavailable, SMShareWarning

    try:
        return GreenShare(device, percent)
    except SMShareUnavailable as exc:
        warnings.warn(
            f"PipelineCallback(green_context=True): {exc}; the producer runs without an SM share",
            SMShareWarning,
            stacklevel=3,
        )
        return None
