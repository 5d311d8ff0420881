"""The sampling stage of the producer: a thread that samples the next batch while the current one is gathered.

With a two-stage batch source (``sample_batch`` / ``gather_batch``) the producer runs the three-stage pipeline
of PyTorch-Direct: while the trainer trains on batch ``t`` and the producer gathers batch ``t + 1`` into its
slot, this thread samples batch ``t + 2``. Every sample of the producer goes through this one thread (a miss is
sampled here too, then waited for), so a builder is never sampled from two threads at once.

On CUDA the thread samples on a stream of its own and records timing events around each sample (a pair reused
from a small pool, :class:`~.stage_times.EventPairs`); :meth:`take` makes the caller's current stream wait for the
end event, so the gather kernels see the finished structure without a host sync, and :meth:`take_timed` hands the
events on, so the producer reads the sample's GPU time once its own stream has synchronized. The sampled tensors
were allocated on the sampling stream and are read by the gather stream until the producer synchronizes that
stream (before it announces the slot). The producer holds each sample until then: freed earlier, its memory would go
back to the caching allocator as the sampling stream's, and the next sample, already running, could overwrite it
while the gather still reads it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Optional

import torch

from lightning_zerocopy.pipeline.stage_times import EventPairs, SampleTime


class Lookahead:
    """Runs sampling one batch ahead of the gather, in one background thread.

    Args:
        make_stream: called once on the sampling thread to create the CUDA stream it samples on (its device
            becomes the thread's current device), or ``None`` to sample without CUDA streams (CPU slots).
    """

    def __init__(self, make_stream: Optional[Callable[[], torch.cuda.Stream]] = None) -> None:
        self._make_stream = make_stream
        self._stream: Optional[torch.cuda.Stream] = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lzc-pipeline-sampler")
        self._key: Optional[Hashable] = None
        self._future: Optional[Future] = None
        self._events = EventPairs()

    def submit(self, key: Hashable, sample: Callable[[], Any]) -> None:
        """Start ``sample()`` for the batch ``key`` (dropping an earlier, untaken one)."""
        self._drop()
        self._key, self._future = key, self._executor.submit(self._run, sample)

    def take(self, key: Hashable, sample: Callable[[], Any]) -> tuple[Any, float]:
        """The sample of batch ``key`` and the host seconds it took: the one submitted ahead if it is ``key``'s,
        else ``sample()`` run now (on the sampling thread). Re-raises the sampler's exception.

        On CUDA the caller's current stream is made to wait for the sample before this returns.
        """
        result, timing = self.take_timed(key, sample)
        host_s = timing.host_s
        timing.release()
        return result, host_s

    def take_timed(self, key: Hashable, sample: Callable[[], Any]) -> tuple[Any, SampleTime]:
        """:meth:`take`, with the sample's :class:`~.stage_times.SampleTime`: on CUDA its events, whose GPU time
        ``SampleTime.seconds()`` reads once the caller's stream (which waits for them) has synchronized."""
        if self._future is None or self._key != key:
            self.submit(key, sample)
        future, self._future, self._key = self._future, None, None
        assert future is not None
        result, events, seconds, cpu_s = future.result()
        if events is not None:
            events[1].wait()  # the caller's current stream waits; no host sync
        return result, SampleTime(seconds, events, self._events if events is not None else None, cpu_s)

    def _run(self, sample: Callable[[], Any]) -> tuple[Any, Optional[tuple[Any, Any]], float, float]:
        """``sample()`` on this thread: its result, its timing events (CUDA), its host seconds and the thread's CPU
        seconds over it (their difference is time the thread slept: on the GPU at its read-backs, or on the host)."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        if self._make_stream is None:
            result = sample()
            return result, None, time.perf_counter() - t0, time.thread_time() - cpu0
        if self._stream is None:
            self._stream = self._make_stream()
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            events = self._events.take()
            events[0].record(self._stream)
            result = sample()
            events[1].record(self._stream)
        return result, events, time.perf_counter() - t0, time.thread_time() - cpu0

    def _drop(self) -> None:
        if self._future is not None:
            self._future.cancel()  # a sample already running finishes on the thread; its result is dropped
            self._future, self._key = None, None

    def close(self) -> None:
        """Drop pending work and stop the thread (waits for a sample in progress)."""
        self._drop()
        self._executor.shutdown(wait=True, cancel_futures=True)
