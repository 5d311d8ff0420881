"""The in-process loader: iterates a :class:`BatchPlan` and builds each batch with a :class:`BatchBuilder`.

It starts no worker processes (the sampling kernel runs its own C++ threads), has a length (so Lightning
does not prefetch a batch just to find the end of the epoch), follows Lightning's ``set_epoch`` protocol, and
is stateful: Lightning saves :meth:`PlanLoader.state_dict` in checkpoints and restores it on resume, so the
rest of an interrupted epoch yields exactly the batches an uninterrupted run would have.
"""

from __future__ import annotations

import abc
import warnings
from typing import Any, Iterator

from torch_geometric.data import Data

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.plan import BatchPlan

__all__ = ["EpochLoader", "PlanLoader"]


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
    def batch_sampler(self) -> None:
        """Batches come from the plan; Lightning inspects this attribute next to :attr:`sampler`."""
        return None

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
        for batch in self._batches(self.epoch, start):
            self._next_step += 1
            yield batch


class PlanLoader(EpochLoader):
    """A sized, stateful iterable of PyG ``Data`` batches: ``builder.build_batch(plan.item(epoch, step))``.

    Args:
        plan: which seeds make up every batch of this rank.
        builder: turns a plan item into a batch (opened on first use).
    """

    def __init__(self, plan: BatchPlan, builder: BatchBuilder) -> None:
        super().__init__()
        self.plan = plan
        self.builder = builder

    def __len__(self) -> int:
        return len(self.plan)

    def _batches(self, epoch: int, start: int) -> Iterator[Data]:
        for step in range(start, len(self.plan)):
            yield self.builder.build_batch(self.plan.item(epoch, step))

    def state_dict(self) -> dict[str, Any]:
        """Position in the plan: the epoch and the number of batches of it already handed out."""
        return {"epoch": self.epoch, "step": self._next_step, "plan": self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position: the next iteration resumes ``state["epoch"]`` at ``state["step"]``."""
        if state.get("plan") != self._fingerprint():
            warnings.warn(
                f"the batch plan changed since the checkpoint was saved ({state.get('plan')} -> {self._fingerprint()}):"
                " the rest of the epoch will not repeat the interrupted run's batches",
                stacklevel=2,
            )
        self.epoch = int(state["epoch"])
        self._start_step = min(int(state["step"]), len(self.plan))
        self._next_step = self._start_step

    def _fingerprint(self) -> dict[str, Any]:
        p = self.plan
        return {
            "num_inputs": int(p.input_nodes.numel()),
            "batch_size": p.batch_size,
            "shuffle": p.shuffle,
            "drop_last": p.drop_last,
            "seed": p.seed,
            "rank": p.rank,
            "world_size": p.world_size,
        }

    def __repr__(self) -> str:
        return f"PlanLoader({self.plan!r}, epoch={self.epoch})"
