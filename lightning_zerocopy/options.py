"""The data path's option types and their validation, in one place.

Each option is a ``Literal`` type; its accepted values are read from the type (``choices(SamplerPlacement)``), so
adding a value is a one-line change here (the code that runs it is another matter). Checks take the *name* to
report: library layers pass the plain argument (``"sampler_placement"``), the DataModule passes its YAML key
(``"data.init_args.sampler_placement"``), so every error names what the user can change.

This module imports nothing of the package, so every layer (sampling, gather, data) may use it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, get_args

__all__ = [
    "FeatureDtype",
    "FeatureStorage",
    "GatherBackend",
    "GatherChoice",
    "GatherMode",
    "NodeOrderKind",
    "RecipeError",
    "RunEnvironmentError",
    "SamplerDevice",
    "SamplerPlacement",
    "check_choice",
    "check_count",
    "check_depth",
    "check_fanouts",
    "check_loader_options",
    "choices",
]

class RunEnvironmentError(OSError):
    """The machine cannot give the run what it needs: shared memory too small, an output folder that cannot be written,
    a disk that fills up. The message says what is missing and the fix; the ``lightning-zerocopy`` command prints it
    as one line and exits with status 2."""

    def __str__(self) -> str:
        return str(self.strerror) if self.strerror else super().__str__()


class RecipeError(ValueError):
    """Settings that cannot work together, found when the run starts rather than when the recipe is read (e.g. a
    model's loss that does not fit the batches the data module makes). The message names the recipe keys to change;
    the ``lightning-zerocopy`` command prints it as one line and exits with status 2."""


#: Where one sampler runs and reads the topology: compiled CPU kernel (``cpu``), CUDA kernel over host topology
#: (``uva``), CUDA kernel over a GPU copy of the topology (``gpu``).
SamplerDevice = Literal["cpu", "uva", "gpu"]
#: Where a builder samples: one of the :data:`SamplerDevice` placements, or per batch on the CPU threads or the ``gpu`` kernel, whichever a
#: calibrated cost model expects to finish first (``hybrid``; ``auto``: hybrid where that measures faster, else
#: the faster device; see :mod:`lightning_zerocopy.sampling.hybrid.policy`).
SamplerPlacement = Literal["cpu", "uva", "gpu", "hybrid", "auto"]
#: How feature rows are fetched: CPU threads (``cpu``) or the GPU reading registered host memory (``zerocopy``).
GatherBackend = Literal["cpu", "zerocopy"]
#: ``gather`` as the DataModule takes it: ``auto`` resolves to ``zerocopy`` on a GPU trainer, else ``cpu``.
GatherChoice = Literal["auto", "cpu", "zerocopy"]
#: How the GPU gather reads host rows: zero-copy in a measured order (``auto``), in batch order (``direct``) or in
#: address order (``sorted``); or host threads into a pinned buffer and one copy-engine copy (``staged``).
GatherMode = Literal["auto", "direct", "sorted", "staged"]
#: Layout of node ids in host memory: the dataset's own ids, or a locality-preserving internal order.
NodeOrderKind = Literal["none", "bfs", "degree"]
#: Where the feature table lives on the host: a shared-memory copy, or a map of the dataset's ``.npy`` file.
FeatureStorage = Literal["shared_memory", "mmap"]
#: The dtype of a feature table in host memory (``bfloat16``/``float16``: half the bytes over PCIe), or of a batch's ``x``.
FeatureDtype = Literal["float32", "bfloat16", "float16"]


def choices(option: Any) -> tuple[str, ...]:
    """The accepted values of an option type, e.g. ``choices(NodeOrderKind) == ("none", "bfs", "degree")``."""
    return tuple(get_args(option))


def _quoted(values: Sequence[str]) -> str:
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _label(name: str) -> str:
    """A plain argument is shown in backticks; a YAML key (dotted) as it is."""
    return name if "." in name else f"`{name}`"


def check_choice(value: Any, option: Any, name: str) -> str:
    """Return ``value`` if it is one of ``choices(option)``, else raise ``ValueError`` naming ``name``.

    Args:
        value: the value given.
        option: the option type (e.g. :data:`SamplerPlacement`).
        name: the argument (``"gather_mode"``) or YAML key (``"data.init_args.gather_mode"``) to name.
    """
    allowed = choices(option)
    if value not in allowed:
        raise ValueError(f"{_label(name)} must be {_quoted(allowed)}, got {value!r}")
    return value


def check_count(value: Any, name: str, *, minimum: int = 0, allow_none: bool = False) -> Optional[int]:
    """Return ``value`` if it is an int ``>= minimum`` (or ``None`` when allowed); else raise naming ``name``.

    Raises:
        TypeError: not an int (``bool`` is rejected too).
        ValueError: below ``minimum``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_label(name)} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{_label(name)} must be >= {minimum}{' or None' if allow_none else ''}, got {value}")
    return int(value)


def check_fanouts(fanouts: Any, name: str = "fanouts") -> list[int]:
    """Return ``fanouts`` as a list of ints, raising ``ValueError``/``TypeError`` naming the bad entry.

    Each fanout is a positive number of neighbors per target for one hop, or ``-1`` for all neighbors.
    """
    label = _label(name)
    if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence):
        raise TypeError(f"{label} must be a sequence of ints (one per hop), got {type(fanouts).__name__}")
    if len(fanouts) == 0:
        raise ValueError(f"{label} is empty; give one fanout per hop, e.g. [15, 10, 5] (-1 = all neighbors)")
    checked = []
    for hop, fanout in enumerate(fanouts):
        entry = f"`{name}[{hop}]`"
        if isinstance(fanout, bool) or not isinstance(fanout, int):
            raise TypeError(f"{entry} must be an int, got {type(fanout).__name__} ({fanout!r})")
        if fanout == 0 or fanout < -1:
            raise ValueError(f"{entry} must be a positive neighbor count or -1 (all neighbors), got {fanout}")
        checked.append(int(fanout))
    return checked


def check_depth(depth: Any, owner: str) -> int:
    """Return ``depth`` (batch slots per loader) if it is an int >= 1, else raise ``ValueError`` naming ``owner``."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"{owner}(depth=...) must be an int >= 1 (2 = ping-pong), got {depth!r}")
    return depth


def check_loader_options(
    batch_size: Any,
    eval_batch_size: Any,
    num_threads: Any,
    fanouts: Any,
    eval_fanouts: Any,
    prefix: str = "",
) -> None:
    """Check a data module's batch sizes, sampler threads and fanouts, naming each bad one as ``prefix + name``.

    Raises:
        ValueError / TypeError: the first bad value, e.g. ``data.init_args.fanouts[1]``.
    """
    check_count(batch_size, prefix + "batch_size", minimum=1)
    check_count(eval_batch_size, prefix + "eval_batch_size", minimum=1, allow_none=True)
    check_count(num_threads, prefix + "num_threads", minimum=1, allow_none=True)
    check_fanouts(list(fanouts), prefix + "fanouts")
    if eval_fanouts is not None:
        check_fanouts(list(eval_fanouts), prefix + "eval_fanouts")


def check_subgraph_options(subgraph_type: Any, disjoint: Any, key: str) -> None:
    """Accept PyG's loader arguments ``subgraph_type`` and ``disjoint`` at the values our batches have (PyG's
    defaults), and refuse the others with what the batches are instead."""
    if subgraph_type != "directional":
        raise ValueError(
            f"{key}subgraph_type={subgraph_type!r} is not supported: batches are sampled 'directional' (PyG's "
            "default: each hop's edges go from the sampled neighbors to their targets); 'bidirectional' and "
            "'induced' subgraphs are not built. Remove the key or set it to 'directional'."
        )
    if not isinstance(disjoint, bool):
        raise TypeError(f"{key}disjoint must be true or false, got {type(disjoint).__name__}")
    if disjoint:
        raise ValueError(
            f"{key}disjoint=true is not supported: a training batch samples one shared subgraph from all its seeds "
            "(PyG's default, disjoint=false). Remove the key or set it to false."
        )
