"""The DataModule's hooks for components that take part in its data path (e.g. ``PipelineCallback``).

The DataModule imports this module, so the hooks name it only as a ``LightningDataModule`` (it is always a
:class:`~lightning_zerocopy.data.graph_datamodule.GraphDataModule`): importing it here would tie the two files into
an import loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

from lightning_zerocopy.options import RecipeError

if TYPE_CHECKING:
    import pytorch_lightning as pl
    from torch_geometric.data import Data

    from lightning_zerocopy.data.loader import PlanLoader

__all__ = ["HostMemoryConsumer", "LoaderFactory", "attach_consumers", "check_typed_consumers"]


class LoaderFactory(Protocol):
    """Turns the DataModule's loader of a split into the iterable its ``*_dataloader`` hook returns
    (:meth:`ZeroCopyDataModule.use_loader_factory`)."""

    def __call__(self, split: str, loader: "PlanLoader") -> Iterable["Data"]: ...


@runtime_checkable
class HostMemoryConsumer(Protocol):
    """A callback (or the trainer's strategy) that uses the DataModule's shared host memory while it can be mapped.

    The strategy's ``attach_host_memory`` runs first (it may set a feature cache with ``set_feature_cache``), then
    the callbacks' in order.

    ``attach_host_memory`` is called on every rank during ``ZeroCopyDataModule.setup``, after the rank has
    mapped the segments and before they are unlinked. It must return only once every process it started has
    opened what it needs (e.g. ``datamodule.builder("train").open()`` in a worker); afterwards the segments
    cannot be opened by name any more.
    """

    def attach_host_memory(self, trainer: "pl.Trainer", datamodule: "pl.LightningDataModule") -> None: ...


def attach_consumers(trainer: "pl.Trainer", datamodule: "pl.LightningDataModule") -> None:
    """Call ``attach_host_memory`` of every :class:`HostMemoryConsumer` of ``trainer``: the strategy first (it
    may set a feature cache), then the callbacks in order (they may hand builders to workers)."""
    for consumer in (trainer.strategy, *trainer.callbacks):
        if isinstance(consumer, HostMemoryConsumer):
            consumer.attach_host_memory(trainer, datamodule)


def check_typed_consumers(trainer: Any) -> None:
    """Every host-memory consumer of ``trainer`` (its strategy, then its callbacks) takes typed builders.

    A consumer says so with ``takes_hetero_builders`` (an attribute or property, false if absent); one that does not
    may say what to change in ``hetero_fix``. Runs before any data is built.

    Raises:
        RecipeError: one line naming the first consumer that does not, and what to change (the command prints it
            as one line).
    """
    for consumer in (trainer.strategy, *trainer.callbacks):
        if isinstance(consumer, HostMemoryConsumer) and not getattr(consumer, "takes_hetero_builders", False):
            fix = getattr(consumer, "hetero_fix", None)
            if fix is None:
                fix = ("it reads the host memory of one homogeneous graph and feature table, e.g. to cache rows on "
                       "the GPU; " + ("set trainer.strategy to ddp" if consumer is trainer.strategy
                                      else "remove it from trainer.callbacks"))  # fmt: skip
            raise RecipeError(f"{type(consumer).__name__} is not yet supported with ZeroCopyHeteroDataModule ({fix})")
