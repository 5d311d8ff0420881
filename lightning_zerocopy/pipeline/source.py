"""The minimal interface the pipeline needs from a data loader: a picklable *batch source*.

A batch source is the DataModule's own batch plan and batch builder bound to one loader (stage, seed, rank,
world size). The pipeline never builds batches any other way: the trainer, an in-process producer thread and
a worker process all call the same two methods, so toggling the pipeline changes where a batch is made, never
what it contains.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, runtime_checkable

import torch
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.pipeline.slots import flatten_hetero

if TYPE_CHECKING:
    from lightning_zerocopy.data.resources import ResourceScope


@runtime_checkable
class BatchSource(Protocol):
    """What the pipeline needs to produce the batches of one loader. Must be picklable (it is sent once to
    the worker process, which opens shared host memory by name or descriptor; no data in the pickle)."""

    def num_steps(self, epoch: int) -> int:
        """Number of batches in ``epoch``."""
        ...

    def plan(self, epoch: int, step: int) -> Any:
        """The plan item (seed ids, batch seed...) of batch ``step`` of ``epoch``: a pure function."""
        ...

    def build_batch(self, item: Any, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """Build the batch of ``item``. ``out`` maps field names to preallocated buffers (capacity-sized, on
        the device the batch should end up on); a builder writes a field's rows into the front of its buffer
        when it fits and returns views of them. Fields it cannot place there are returned as fresh tensors;
        the pipeline copies those in (and grows the slot when a batch is larger than its capacity)."""
        ...


def two_stage(source: Any) -> bool:
    """Whether ``source`` splits ``build_batch`` into ``sample_batch(item)`` and ``gather_batch(sampled, out)``.

    A two-stage source lets the producer sample batch ``t + 2`` while it gathers batch ``t + 1`` (the trainer
    trains on ``t``); ``build_batch(item, out)`` must equal ``gather_batch(sample_batch(item), out)``.
    """
    return callable(getattr(source, "sample_batch", None)) and callable(getattr(source, "gather_batch", None))


def takes_marks(gather_batch: Any) -> bool:
    """Whether a ``gather_batch`` callable takes ``marks=`` (the stage clock a producer hands a builder, see
    :class:`~lightning_zerocopy.data.assemble.StageMarks`): a parameter of that name, or ``**kwargs``."""
    try:
        parameters = inspect.signature(gather_batch).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "marks" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def field_levels(source: Any) -> dict[str, tuple[str, int]]:
    """``name -> (level, dim)`` of the source's attribute fields (``"node"`` / ``"edge"`` and the dimension that runs
    over them), if it says (``field_levels()``): a slot layout follows them rather than the first batch's sizes."""
    fn = getattr(source, "field_levels", None)
    return dict(fn()) if callable(fn) else {}


def capacity_hint(source: Any) -> Optional[dict[str, int]]:
    """The source's upper bound on batch sizes per axis, if it offers one (``capacity_hint()``)."""
    fn = getattr(source, "capacity_hint", None)
    hint = None if fn is None else fn()
    return dict(hint) if hint is not None else None


class PlanSource:
    """A :class:`BatchSource` made of a DataModule's batch plan and its picklable batch builder.

    Args:
        plan: the loader's plan (``plan.item(epoch, step)``, ``len(plan)`` steps per epoch), e.g.
            ``ZeroCopyDataModule.plan("train")``.
        builder: the unopened builder (``build_batch(item, out=None)``, ``fanouts``, ``num_nodes``,
            ``max_nodes(batch_size)``), e.g. ``ZeroCopyDataModule.builder("train")``.
        out_fields: the batch fields the builder writes into ``out`` itself (the rest are copied into the slot);
            default: the builder's ``slot_fields`` if it has them (none for a heterogeneous builder), else
            ``("x", "y")``.
        place_on_open: place the builder's GPU side when the source is opened; ``False`` maps the host memory only
            and places the rest at the first batch (a standby producer that may never build).
    """

    def __init__(
        self, plan: Any, builder: Any, out_fields: Optional[tuple[str, ...]] = None, place_on_open: bool = True
    ) -> None:
        self._plan = plan
        self.builder = builder
        self.out_fields = tuple(getattr(builder, "slot_fields", ("x", "y")) if out_fields is None else out_fields)
        self.place_on_open = bool(place_on_open)

    def open(self, scope: Optional["ResourceScope"] = None) -> None:
        """Open the builder in this process with the resources ``scope`` owns for its host memory and device
        (shared with the other sources of the same producer); without a scope the builder owns private ones."""
        resources = None if scope is None else scope.get(self.builder.handles, self.builder.device_index)
        self.builder.open(resources, place=getattr(self, "place_on_open", True))

    def close(self) -> None:
        """Release the builder (its resources stay with the scope that owns them)."""
        self.builder.close()

    def num_steps(self, epoch: int) -> int:
        return len(self._plan)

    def plan(self, epoch: int, step: int) -> Any:
        return self._plan.item(epoch, step)

    def capacity_hint(self) -> Optional[dict[str, int]]:
        """Slot capacity no batch exceeds: the fanouts bound (:func:`~.slots.capacity_bound`), capped by the graph;
        a builder with a ``capacity_bound(seeds)`` of its own gives it (``None``: none known, the slots are sized
        from the first batch and grow)."""
        from lightning_zerocopy.pipeline.slots import capacity_bound

        seeds = getattr(self._plan, "max_seed_nodes", self._plan.batch_size)  # a link plan's seeds are endpoints
        own = getattr(self.builder, "capacity_bound", None)
        if callable(own):
            return own(seeds)
        schema = getattr(getattr(self.builder, "handles", None), "schema", None)
        if schema is not None and schema.is_typed:  # per-type bounds are not derived: slots grow from the first batch
            return None
        return capacity_bound(seeds, self.builder.fanouts, num_nodes=self.builder.num_nodes,
                              node_keyed=bool(getattr(self.builder, "node_keyed", False)))  # fmt: skip

    def field_levels(self) -> dict[str, tuple[str, int]]:
        """``name -> (level, dim)`` of the attributes of the builder's untyped batches (a typed batch's fields are
        flattened per type, each with an axis of its own: none)."""
        handles = getattr(self.builder, "handles", None)
        if handles is None or handles.schema.is_typed:
            return {}
        return {key.name: (key.level, attribute.dim) for key, attribute in handles.attributes}

    def build_batch(self, item: Any, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        """``builder.build_batch(item, out)``: :meth:`gather_batch` of :meth:`sample_batch`."""
        return self.gather_batch(self.sample_batch(item), out)

    def sample_batch(self, item: Any, lane: Optional[str] = None) -> Any:
        """The builder's first stage (``builder.sample_batch``): the sampled structure, no slot needed. ``lane``
        names the device of a hybrid builder (chosen by the producer's dispatcher)."""
        if lane is None:
            return self.builder.sample_batch(item)
        return self.builder.sample_batch(item, lane=lane)

    def hybrid_policy(self) -> Any:
        """The builder's hybrid placement policy (``None``: it samples on one device)."""
        factory = getattr(self.builder, "hybrid_policy", None)
        return factory() if callable(factory) else None

    def expected_size(self, item: Any) -> float:
        """The expected sampled-subgraph size of ``item`` (hybrid builders), the cost models' input."""
        return float(self.builder.expected_size(item))

    def gather_batch(self, sampled: Any, out: Optional[Mapping[str, torch.Tensor]] = None, marks: Any = None) -> Data:
        """``builder.gather_batch(sampled, out)`` with the slot's buffers where the builder can write them.

        ``marks`` (the producer's stage clock) goes to a builder that takes it (:func:`takes_marks`).

        A builder that builds on the GPU (``builder.on_gpu``: GPU/UVA sampling or the zero-copy gather) writes
        features and labels straight into CUDA slots, on the producer's stream. A host builder gathers on the
        CPU: host slots are handed to it directly, and for CUDA slots it gathers into page-locked staging buffers
        of the same capacity (kept by this process), which the pipeline then copies into the slot
        asynchronously. ``out`` is only handed over when every batch is guaranteed to fit, so the builder never
        fails on a small buffer (the slot grows instead).

        A heterogeneous batch is returned flattened (:func:`~lightning_zerocopy.pipeline.slots.flatten_hetero`)
        for the slots; the trainer's side rebuilds it.
        """
        extra = {"marks": marks} if marks is not None and self._builder_takes_marks() else {}
        if out is None or not self.out_fields:
            data = self.builder.gather_batch(sampled, **extra)
            return flatten_hetero(data) if isinstance(data, HeteroData) else data
        rows = int(self.builder.max_nodes(sampled.item.batch_size))
        on_gpu = bool(getattr(self.builder, "on_gpu", False))
        targets = {}
        for key in self.out_fields:
            buf = out.get(key)
            if buf is None or buf.size(0) < rows:
                continue
            targets[key] = self._staging_like(key, buf) if buf.is_cuda and not on_gpu else buf
        return self.builder.gather_batch(sampled, out=targets or None, **extra)

    def _builder_takes_marks(self) -> bool:
        known = self.__dict__.get("_takes_marks")
        if known is None:
            known = self.__dict__["_takes_marks"] = takes_marks(self.builder.gather_batch)
        return known

    def _staging_like(self, key: str, buf: torch.Tensor) -> torch.Tensor:
        staging = self.__dict__.setdefault("_staging", {})
        host = staging.get(key)
        if host is None or host.shape != buf.shape or host.dtype != buf.dtype:
            host = staging[key] = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
        return host

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_staging", None)  # per-process page-locked buffers
        state.pop("_takes_marks", None)
        return state
