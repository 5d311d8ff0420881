"""``PipelineLoader``: a DataModule loader whose batches are built by the pipeline's producer.

It stands in for the DataModule's own :class:`~lightning_zerocopy.data.loader.PlanLoader` and keeps its
contract (length, ``set_epoch``, mid-epoch ``state_dict``/``load_state_dict`` in the same format), so a
checkpoint saved with the pipeline resumes without it and vice versa.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Optional

from torch_geometric.data import Data

from lightning_zerocopy.data.loader import EpochLoader
from lightning_zerocopy.data.resume import ResumedPlan
from lightning_zerocopy.pipeline.client import PipelineClient
from lightning_zerocopy.pipeline.source import PlanSource


class PipelineLoader(EpochLoader):
    """Iterates ``inner``'s plan through ``client`` (stage ``stage`` must be registered with the same plan).

    Args:
        client: the pipeline.
        stage: the registered stage name.
        inner: the DataModule's loader it replaces (a ``PlanLoader``: ``len``, ``epoch``, ``start_step``,
            ``state_dict``/``load_state_dict``).
        copy: yield a copy of each batch instead of views of its slot (for loops that keep what the step
            returns, like ``predict``, whose outputs often include ``batch.n_id``).
        current: the client to take the next batch from (``None``: always ``client``).
        limit: how many of the epoch's batches the loop will take (``None``: all of them), asked when an epoch's
            iteration starts: the producer builds no batch past it, and its last batch arrives with the feature
            caches' totals (``DataTelemetry``'s epoch figures under ``limit_train_batches``).
    """

    def __init__(
        self,
        client: PipelineClient,
        stage: str,
        inner: Any,
        copy: bool = False,
        current: Optional[Callable[[], PipelineClient]] = None,
        limit: Optional[Callable[[], Optional[int]]] = None,
    ) -> None:
        super().__init__(epoch=int(getattr(inner, "epoch", 0)), start_step=int(getattr(inner, "start_step", 0)))
        self.client = client
        self.stage = stage
        self.inner = inner
        self.copy = copy
        self._current = current
        self._limit = limit

    def __len__(self) -> int:
        return len(self.inner)

    def _batches(self, epoch: int, start: int) -> Iterator[Data]:
        """The batches from ``start`` on; when ``current()`` names another client between two batches (the
        callback moved to a worker with another SM share), the rest of the epoch comes from that one, from the
        next step on: the batches are the plan's either way."""
        step, stop = start, len(self)
        limit = self._limit() if self._limit is not None else None
        if limit is not None:
            stop = max(start, min(stop, limit))
        while step < stop:
            if self._current is not None:
                self.client = self._current()
            client, first = self.client, step
            batches = client.iterate(self.stage, epoch, step, stop)
            try:
                for batch in batches:
                    step += 1
                    yield batch.clone() if self.copy else batch
                    if self._current is not None and self._current() is not client:
                        break
            finally:
                batches.close()  # hands the last slot back (after the step that used it) and ends the iteration
            if step == first:
                return  # the producer ended the epoch early: nothing more to ask for

    def _batch_indices(self, epoch: int, step: int) -> list[int]:
        return self.inner._batch_indices(epoch, step)

    def state_dict(self) -> dict[str, Any]:
        if hasattr(self.inner, "state_dict_at"):  # a PlanLoader: its epoch segments at this loader's position
            return self.inner.state_dict_at(self.epoch, self._next_step)
        state = dict(self.inner.state_dict())
        state.update(epoch=self.epoch, step=self._next_step)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)  # validates the plan fingerprint
        plan = getattr(self.inner, "plan", None)
        if isinstance(plan, ResumedPlan):  # resumed on another world size: the producer deals the remainder too
            builder = copy.deepcopy(self.inner.builder)  # unopened (a builder copies its handles, not its resources)
            self.client.register(self.stage, PlanSource(plan, builder))
        self.epoch = int(self.inner.epoch)
        self._start_step = int(self.inner.start_step)
        self._next_step = self._start_step

    def __repr__(self) -> str:
        return f"PipelineLoader(stage={self.stage!r}, inner={self.inner!r})"
