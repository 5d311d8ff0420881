"""The in-process loader: iterates a :class:`BatchPlan` and builds each batch with a :class:`BatchBuilder`.

It starts no worker processes (the sampling kernel runs its own C++ threads), has a length (so Lightning
does not prefetch a batch just to find the end of the epoch), follows Lightning's ``set_epoch`` protocol, and
is stateful: Lightning saves :meth:`PlanLoader.state_dict` in checkpoints and restores it on resume, so the
rest of an interrupted epoch yields exactly the batches an uninterrupted run would have. Resumed on another number
of ranks (or batch size), the rest of the epoch trains exactly the seeds it had left, dealt over the new ranks
(:mod:`lightning_zerocopy.data.resume`).
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Optional, Union, overload

from pytorch_lightning.overrides.distributed import _IndexBatchSamplerWrapper
from torch_geometric.data import Data

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.data.resume import EpochSegment, ResumedPlan

#: fingerprint keys that fix every epoch's seed order; a checkpoint that differs in one cannot be resumed exactly
_ORDER_KEYS = ("num_inputs", "shuffle", "drop_last", "seed")

__all__ = ["EpochLoader", "PlanLoader", "SeenBatchIndices"]


class EpochLoader(abc.ABC):
    """Lightning's loader protocol for plan-driven batches: a length, ``set_epoch`` and a mid-epoch position.

    Subclasses say how many batches an epoch has (``__len__``) and produce the batches of an epoch from a
    given step on (:meth:`_batches`); this class tracks the epoch and how many batches were handed out, so
    :meth:`__iter__` resumes where a restored state left off.
    """

    def __init__(self, epoch: int = 0, start_step: int = 0) -> None:
        self.epoch = int(epoch)
        self._start_step = int(start_step)
        self._next_step = self._start_step
        self._seen = SeenBatchIndices(self)

    @abc.abstractmethod
    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    @abc.abstractmethod
    def _batches(self, epoch: int, start: int) -> Iterator[Data]:
        """The batches of ``epoch`` from step ``start`` to the end of the epoch, in order."""

    @property
    def sampler(self) -> "EpochLoader":
        """Lightning calls ``loader.sampler.set_epoch(epoch)`` before every epoch; the loader is its own sampler."""
        return self

    @property
    def batch_sampler(self) -> "SeenBatchIndices":
        """The seed positions of the batches handed out in the current iteration, where Lightning's prediction loop
        looks for them (``BasePredictionWriter``'s ``batch_indices``)."""
        return self._seen

    def _batch_indices(self, epoch: int, step: int) -> list[int]:
        """Positions, in the split's input nodes, of the seeds of batch ``step`` of ``epoch`` (PyG's ``input_id``).
        Loaders that can say override this; by default a batch has none."""
        return []

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs (a new epoch starts at step 0)."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._start_step = 0

    @property
    def start_step(self) -> int:
        """The step the next iteration starts from (non-zero after restoring a mid-epoch state)."""
        return self._start_step

    def __iter__(self) -> Iterator[Data]:
        start, self._start_step = self._start_step, 0
        self._next_step = start
        self._seen.restart(self.epoch, start)
        for batch in self._batches(self.epoch, start):
            self._next_step += 1
            yield batch


class SeenBatchIndices(_IndexBatchSamplerWrapper):
    """The sample indices of the batches an :class:`EpochLoader` handed out in its current iteration, one list per
    batch, computed from the plan when asked (nothing is stored per batch).

    Lightning's prediction loop reads a loader's batch indices only from ``loader.batch_sampler.seen_batch_indices``
    of an ``_IndexBatchSamplerWrapper``, which it puts around a ``DataLoader``'s batch sampler; a plan loader is no
    ``DataLoader``, so without this every predict with a ``BasePredictionWriter`` warned "Couldn't infer the batch
    indices fetched from your dataloader" and handed the writer empty indices. This subclass gives that loop the
    same thing (the seeds' positions in the split, as PyG's ``input_id``; its ``batch_idx`` counts from the
    iteration's first batch). It is not iterated: batches come from the loader.
    """

    def __init__(self, loader: "EpochLoader") -> None:  # no super().__init__: it would wrap a batch sampler
        self._loader = loader
        self._epoch = 0
        self._start = 0
        self.seen_batch_indices = _LazyBatchIndices(self)

    def restart(self, epoch: int, start: int) -> None:
        self._epoch, self._start = int(epoch), int(start)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[list[int]]:
        raise TypeError("an EpochLoader's batch_sampler only reports the indices of the batches the loader handed out")

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()


class _LazyBatchIndices(Sequence[list[int]]):
    """``seen_batch_indices`` of a :class:`SeenBatchIndices`: as long as the batches handed out so far."""

    def __init__(self, owner: SeenBatchIndices) -> None:
        self._owner = owner

    def __len__(self) -> int:
        owner = self._owner
        return max(0, owner._loader._next_step - owner._start)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...

    @overload
    def __getitem__(self, i: slice) -> list[list[int]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[list[int], list[list[int]]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"batch {i} was not handed out in this iteration ({n} were)")
        owner = self._owner
        return owner._loader._batch_indices(owner._epoch, owner._start + i)


class PlanLoader(EpochLoader):
    """A sized, stateful iterable of PyG ``Data`` batches: ``builder.build_batch(plan.item(epoch, step))``.

    Args:
        plan: which seeds make up every batch of this rank.
        builder: turns a plan item into a batch (opened on first use).
        on_resume: called with the first step of a restored epoch that was interrupted under another world size or
            batch size (its remainder runs in the plan's last steps): the DataModule moves the trainer's batch
            count there (:func:`~lightning_zerocopy.data.resume.align_fit_progress`).
    """

    def __init__(self, plan: BatchPlan, builder: BatchBuilder, on_resume: Optional[Callable[[int], None]] = None) -> None:
        super().__init__()
        self.base_plan = plan
        self.plan: Union[BatchPlan, ResumedPlan] = plan
        self.builder = builder
        self.on_resume = on_resume

    def __len__(self) -> int:
        return len(self.plan)

    def _batches(self, epoch: int, start: int) -> Iterator[Data]:
        for step in range(start, len(self.plan)):
            yield self.builder.build_batch(self.plan.item(epoch, step))

    def _batch_indices(self, epoch: int, step: int) -> list[int]:
        return self.plan.item(epoch, step).input_id.tolist()

    def state_dict(self) -> dict[str, Any]:
        """Position in the plan: the epoch, the number of batches of it already handed out (every rank has handed
        out as many: ranks run in lockstep), and the epoch's segments (world size, batch size, steps) so far."""
        return self.state_dict_at(self.epoch, self._next_step)

    def state_dict_at(self, epoch: int, next_step: int) -> dict[str, Any]:
        """:meth:`state_dict` for a loader that wraps this one and has handed out ``next_step`` batches of ``epoch``."""
        resumed = isinstance(self.plan, ResumedPlan) and self.plan.epoch == epoch
        earlier = list(self.plan.segments) if resumed else []
        offset = self.plan.start_step if resumed else 0
        current = EpochSegment(self.base_plan.world_size, self.base_plan.batch_size, next_step - offset)
        return {"epoch": epoch, "step": next_step, "plan": self._fingerprint(),
                "segments": [s.as_list() for s in [*earlier, current]]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position: the next iteration resumes ``state["epoch"]`` at ``state["step"]``; saved
        under another world size or batch size, it trains the seeds the epoch had left, in the plan's last steps."""
        saved, mine = state.get("plan") or {}, self._fingerprint()
        epoch, step = int(state["epoch"]), int(state["step"])
        segments = [EpochSegment(*s) for s in state.get("segments", ())] or [
            EpochSegment(int(saved.get("world_size", mine["world_size"])), int(saved.get("batch_size", mine["batch_size"])), step)
        ]  # fmt: skip
        self.epoch, self.plan = epoch, self.base_plan
        last = segments[-1]
        if any(saved.get(key) != mine[key] for key in _ORDER_KEYS):
            warnings.warn(
                f"the batch plan changed since the checkpoint was saved ({saved} -> {mine}): the rest of the epoch"
                " will not repeat the interrupted run's batches",
                stacklevel=2,
            )
            self._start_step = min(step, len(self.plan))
        elif (last.world_size, last.batch_size) == (mine["world_size"], mine["batch_size"]):
            if len(segments) > 1:  # the interrupted run was itself a resumed epoch: the same remainder again
                self.plan = ResumedPlan(self.base_plan, epoch, segments[:-1])
            self._start_step = min(step, len(self.plan))
        elif sum(s.steps for s in segments) == 0:
            self._start_step = 0  # nothing of the epoch ran: the new plan's own epoch
        else:
            self.plan = ResumedPlan(self.base_plan, epoch, segments)
            self._start_step = self.plan.start_step
            if self.on_resume is not None:
                self.on_resume(self._start_step)
        self._next_step = self._start_step

    def _fingerprint(self) -> dict[str, Any]:
        p = self.base_plan
        fields = ("batch_size", "shuffle", "drop_last", "seed", "rank", "world_size")
        return {"num_inputs": int(p.input_nodes.numel()), **{name: getattr(p, name) for name in fields}}

    def __repr__(self) -> str:
        return f"PlanLoader({self.plan!r}, epoch={self.epoch})"
