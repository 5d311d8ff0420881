"""Batch pipelines: build mini-batches ahead of the trainer, in a worker process or a thread.

* :mod:`.slots` — the ring of preallocated batch buffers shared once with the producer;
* :mod:`.producer` / :mod:`.client` — the producer loop and the trainer side of their small protocol;
* :mod:`.worker` — the worker process (CUDA IPC, optional MPS share); :mod:`.in_process` — a producer thread
  with a side CUDA stream;
* :mod:`.mps` — the CUDA MPS control daemon, started before any CUDA context.

Importing this package starts nothing: no process, no daemon, no CUDA context.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from lightning_zerocopy.pipeline.client import PipelineClient, PipelineError, PipelineStats
from lightning_zerocopy.pipeline.slots import SlotLayout, SlotRing, capacity_bound
from lightning_zerocopy.pipeline.source import BatchSource

__all__ = [
    "BatchSource",
    "PipelineClient",
    "PipelineError",
    "PipelineStats",
    "SlotLayout",
    "SlotRing",
    "capacity_bound",
    "start_pipeline",
]


def start_pipeline(
    mode: str,
    depth: int = 2,
    device: torch.device | str = "cpu",
    worker_env: Optional[Mapping[str, str]] = None,
    timeout: float = 600.0,
) -> PipelineClient:
    """Start a producer (``mode="worker"``: a process; ``"in_process"``: a thread) and return its client.

    Args:
        mode: ``"worker"`` or ``"in_process"``.
        depth: slots per loader (2 = ping-pong).
        device: where slots live (a CUDA device, or CPU for shared host memory).
        worker_env: environment set in the worker process before it touches CUDA.
        timeout: seconds to wait for one batch from a live producer before raising.
    """
    device = torch.device(device)
    if mode == "worker":
        from lightning_zerocopy.pipeline.worker import WorkerTransport

        transport = WorkerTransport(device, env=worker_env)
    elif mode == "in_process":
        from lightning_zerocopy.pipeline.in_process import ThreadTransport

        transport = ThreadTransport(device)
    else:
        raise ValueError(f"PipelineCallback(mode=...) must be 'worker', 'in_process' or 'auto', got {mode!r}")
    return PipelineClient(transport, depth=depth, device=device, timeout=timeout)
