"""A scaling run in phases: a warm-up epoch on the data path, then measured epochs on the data path (``data``) or on a
ring of batches pre-staged on the device (``model``: no data path at all, the model-only row).

:class:`RingPhases` is a ``HostMemoryConsumer`` callback: when the DataModule sets up it wraps the training loader
the DataModule hands out (the pipeline's, when a :class:`~lightning_zerocopy.callbacks.PipelineCallback` attached
first, else the in-process one) in a :class:`PhasedLoader`. During the warm-up the first ``ring_batches`` batches
are copied (``clone``: a pipeline batch is a view of a slot the worker refills) and kept on the device: real
batches of the run's own plan, built by our builder, with the shapes and the module of the data-path steps. A
``model`` epoch replays them round-robin; a ``data`` epoch iterates the data path, timing each ``next()`` (the
wait for the pipeline worker, or the in-process build) for :class:`~benchmarks.scaling.timeline.StepTimeline`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import pytorch_lightning as pl

__all__ = ["PHASES", "PhasedLoader", "RingPhases"]

#: the measured phases a run may have after its warm-up epoch
PHASES = ("data", "model")


class RingPhases(pl.Callback):
    """Phases per epoch and the ring of staged batches (see the module docstring).

    Args:
        phases: the phase of each epoch after the warm-up (epoch 0), each ``"data"`` or ``"model"``.
        ring_batches: batches copied during the warm-up and replayed by ``model`` epochs.
        handover: the pipeline client's wait for the latest batch, in seconds (``None`` without a pipeline).

    Raises:
        ValueError: an unknown phase or fewer than one ring batch.
    """

    takes_hetero_builders = True  # it wraps the training loader only: Data and HeteroData batches alike

    def __init__(self, phases: list[str], ring_batches: int = 16,
                 handover: Optional[Callable[[], Optional[float]]] = None) -> None:  # fmt: skip
        unknown = [p for p in phases if p not in PHASES]
        if unknown or not phases:
            raise ValueError(f"phases must be one or more of {PHASES}, got {phases}")
        if ring_batches < 1:
            raise ValueError(f"ring_batches must be >= 1, got {ring_batches}")
        self.phases, self.ring_batches = list(phases), int(ring_batches)
        self.handover = handover or (lambda: None)
        self.ring: list[Any] = []
        self.last_fetch: tuple[Optional[float], Optional[float]] = (None, None)
        self.wrapped = 0

    @property
    def epochs(self) -> int:
        """The fit's epochs: the warm-up and one per phase."""
        return 1 + len(self.phases)

    def phase_of(self, epoch: int) -> str:
        return "warmup" if epoch == 0 else self.phases[min(epoch, len(self.phases)) - 1]

    def attach_host_memory(self, trainer: "pl.Trainer", datamodule: Any) -> None:
        """Wrap the DataModule's training loader (after the pipeline's factory, if one is set: callbacks attach in
        order, so this callback goes after the ``PipelineCallback``)."""
        previous = datamodule.loader_factory

        def factory(split: str, loader: Any) -> Any:
            inner = previous(split, loader) if previous is not None else loader
            if split != "train":
                return inner
            self.wrapped += 1
            return PhasedLoader(inner, self)

        datamodule.use_loader_factory(factory)

    def fetched(self) -> tuple[Optional[float], Optional[float]]:
        """``(seconds in next(), the pipeline's own wait)`` of the latest fetch (``(0, None)`` from the ring)."""
        return self.last_fetch


class PhasedLoader:
    """The training loader of a phased run: the data path's loader or the ring, by the epoch's phase.

    Keeps the wrapped loader's length and epoch protocol (Lightning calls ``sampler.set_epoch``).
    """

    def __init__(self, inner: Any, owner: RingPhases) -> None:
        self.inner, self.owner = inner, owner
        self.epoch = int(getattr(inner, "epoch", 0))

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def sampler(self) -> "PhasedLoader":
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        sampler = getattr(self.inner, "sampler", None)
        if sampler is not None and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        owner = self.owner
        if owner.phase_of(self.epoch) == "model":
            if not owner.ring:
                raise RuntimeError("a model-only epoch needs the ring of staged batches, which the warm-up fills: "
                                   "give the warm-up at least one batch (--warmup-batches)")  # fmt: skip
            for i in range(len(self)):
                owner.last_fetch = (0.0, None)
                yield owner.ring[i % len(owner.ring)]
            return
        batches = iter(self.inner)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                owner.last_fetch = (time.perf_counter() - t0, owner.handover())
                if len(owner.ring) < owner.ring_batches:
                    owner.ring.append(batch.clone())  # a pipeline batch is a view of a slot the producer refills
                yield batch
        finally:  # an epoch cut short (the run's step cap) ends the data path's iteration now, as its own loop would
            close = getattr(batches, "close", None)
            if close is not None:
                close()
