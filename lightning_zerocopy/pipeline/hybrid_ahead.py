"""The producer's hybrid sampling: batches of a hybrid source sampled ahead on several devices, taken back in order.

A two-stage source whose ``hybrid_policy()`` returns a policy (a builder with ``sampler_placement='hybrid'`` or
``'auto'``) is sampled through a :class:`~lightning_zerocopy.sampling.HybridDispatcher` instead of the lookahead
thread: :class:`HybridAhead` keeps ``depth`` batches sampled ahead of the one being gathered, each on the device (CPU
threads or the GPU, one thread and stream each) expected to finish it first, and takes them back in batch order. The
source's ``expected_size(item)`` feeds the cost model and ``sample_batch(item, lane=...)`` samples on the chosen
device. One dispatcher (and cost model) serves every stage of a producer (:mod:`.producer`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from lightning_zerocopy.sampling.hybrid import HybridDispatcher


class HybridAhead:
    """A producer's batches sampled ahead through one :class:`HybridDispatcher` (made by the first hybrid source).

    Args:
        depth: batches kept sampled ahead of the one being gathered (split between the devices by the dispatcher).

    ``make_stream`` (set by the producer once it runs) makes the CUDA stream of a device's sampling thread, or is
    ``None`` without CUDA.
    """

    def __init__(self, depth: int) -> None:
        self.depth = int(depth)
        self.make_stream: Optional[Callable[[], Any]] = None
        self.dispatcher: Optional[HybridDispatcher] = None
        self._last_take: Optional[float] = None  # when the producer last took a hybrid sample
        self._take_interval: Optional[float] = None  # EWMA of the seconds between takes: the deadlines' unit

    def uses(self, st: Any) -> bool:
        """Whether the producer's stage ``st`` is sampled here (decided once per source, in ``st.hybrid``)."""
        if st.hybrid is None:
            factory = getattr(st.source, "hybrid_policy", None)
            policy = factory() if callable(factory) else None
            st.hybrid = policy is not None
            if policy is not None and self.dispatcher is None:  # one dispatcher (and cost model) for every stage
                make_stream = self.make_stream
                self.dispatcher = HybridDispatcher(policy, make_stream=None if make_stream is None else (lambda lane: make_stream()))
        return bool(st.hybrid)

    def take(self, name: str, st: Any, step: int) -> tuple[Any, float]:
        """Batch ``step`` of stage ``name`` sampled (the next ``depth`` submitted first); sets ``st.dispatch`` and
        returns the sample with the host seconds the dispatcher measured for it."""
        dispatcher, source, epoch, gen = self.dispatcher, st.source, st.epoch, st.gen
        assert dispatcher is not None
        interval = self._take_interval
        for ahead in range(step, min(step + 1 + self.depth, st.stop)):
            if (name, gen, ahead) not in dispatcher:
                item = source.plan(epoch, ahead)
                deadline_s = None if interval is None else (ahead - step) * interval  # when it will be taken
                dispatcher.submit((name, gen, ahead), source.expected_size(item),
                                  lambda lane, item=item: source.sample_batch(item, lane=lane), deadline_s)  # fmt: skip
        sampled, st.dispatch = dispatcher.take((name, gen, step))
        now = time.perf_counter()
        if self._last_take is not None:
            gap = now - self._last_take
            self._take_interval = gap if interval is None else 0.8 * interval + 0.2 * gap
        self._last_take = now
        sample_s = st.dispatch.measured_s if st.dispatch is not None else 0.0
        return sampled, sample_s

    def drop(self, name: str, keep_gen: Optional[int] = None) -> None:
        """Forget the batches a stage had sampled ahead, except those of generation ``keep_gen``."""
        if self.dispatcher is not None:
            self.dispatcher.drop(lambda key: key[0] == name and key[1] != keep_gen)

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()
