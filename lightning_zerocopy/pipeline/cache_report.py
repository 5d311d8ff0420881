"""The feature-cache counters a worker's producer reports to the trainer (``report_cache``).

The GPU feature caches a worker opens (:func:`~lightning_zerocopy.cache.sharded_provider.process_cache_counts`) count
their local / peer / host rows on the GPU, in the worker, where the trainer's
:class:`~lightning_zerocopy.callbacks.DataTelemetry` cannot read them. The producer (:mod:`.producer`) reads them where
it synchronizes its stream anyway, just before it announces a ready slot: at the last batch of an iteration and every
:data:`CACHE_REPORT_EVERY` batches (the counters are written by the gathers on that stream, which has just been
synchronized: the read is a copy of a few integers that waits for no GPU work, and nothing in the trainer synchronizes
for it), and once when the trainer abandons an iteration early. It sends the cumulative totals in a ``cache`` message
ahead of that batch's ``ready``, so the trainer has the totals of a whole iteration by the time it takes its last
batch. An in-process producer does not report: its caches belong to the trainer's process, where the strategy counts
them already.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Optional

import torch

from lightning_zerocopy.pipeline.channel import ChannelClosed

#: a reporting producer reads its feature caches' counters at most once per this many batches of a stage (and at
#: the last batch of each iteration)
CACHE_REPORT_EVERY = 32


class CacheReport:
    """Sends ``("cache", stage, counts)`` through a producer's ``send`` when ``enabled`` (a worker process)."""

    def __init__(self, enabled: bool, send: Callable[[tuple], None]) -> None:
        self.enabled = bool(enabled)
        self._send = send

    def report(self, name: str) -> None:
        """Send the cumulative row counts of this process's feature caches (``enabled`` only)."""
        if not self.enabled:
            return
        counts = process_cache_counts()
        if counts is not None:
            self._send(("cache", name, counts))

    def report_quietly(self, name: str, stream: Optional[Any]) -> None:
        """:meth:`report` outside a build (on the producer's ``stream``; a failure only skips the report)."""
        if not self.enabled:
            return
        on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        try:
            with on_stream:
                self.report(name)
        except ChannelClosed:
            raise
        except Exception:  # noqa: BLE001 - telemetry; the next batch's report raises a real fault with its build
            pass


def process_cache_counts() -> Optional[tuple[Any, ...]]:
    """``(local, peer, host, row_bytes, per_plan)`` of the feature caches open in this process, or ``None``
    (:func:`~lightning_zerocopy.cache.sharded_provider.process_cache_counts`).

    Caches are tracked by :mod:`lightning_zerocopy.cache.sharded_provider`, which a builder carrying one imports when
    it is unpickled; if that module was never imported here, no cache is open (and the strategies package, which
    imports Lightning, is not imported for nothing).
    """
    module = sys.modules.get("lightning_zerocopy.cache.sharded_provider")
    return None if module is None else module.process_cache_counts()
