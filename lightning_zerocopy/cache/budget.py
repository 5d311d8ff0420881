"""``cache_budget``: how many bytes of feature rows one GPU may cache.

A budget is written as bytes (``"8GiB"``, ``"512MB"``, ``1073741824``), as a share of the GPU memory that is free
after the model is placed (``"40%"``), or ``0`` (no cache). :func:`parse_budget` checks the spelling when the
strategy is constructed (a bad recipe fails before any data is built); :func:`resolve_budget` turns it into bytes
on the GPU once the model is there.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Literal, Union

__all__ = ["BudgetSpec", "CacheBudget", "format_bytes", "parse_budget", "resolve_budget"]

#: What a recipe may write for ``cache_budget``.
CacheBudget = Union[str, int]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*|%)\s*$")
#: Share of the free GPU memory a byte budget may take before it is clamped (the rest is left to activations).
HEADROOM = 0.9


@dataclass(frozen=True)
class BudgetSpec:
    """A parsed ``cache_budget``.

    Attributes:
        kind: ``"bytes"`` (an absolute size) or ``"fraction"`` (a share of the free GPU memory).
        amount: bytes for ``"bytes"``, a share in ``[0, 1]`` for ``"fraction"``.
        text: the budget as the user wrote it (for messages).
    """

    kind: Literal["bytes", "fraction"]
    amount: float
    text: str

    @property
    def is_zero(self) -> bool:
        """Whether the budget caches nothing."""
        return self.amount == 0


def parse_budget(value: CacheBudget, key: str = "cache_budget") -> BudgetSpec:
    """Parse a cache budget: bytes (``"8GiB"``, ``"1.5GB"``, ``"512MiB"``, an int), a share (``"40%"``) or ``0``.

    Args:
        value: the budget as written in the recipe.
        key: the option's name, used in error messages.

    Raises:
        ValueError: a negative or unreadable size, an unknown unit, or a share above 100%.
    """
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a size like '8GiB', a share like '40%' or 0, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{key} must be >= 0 bytes, got {value}")
        return BudgetSpec("bytes", float(value), str(value))
    if isinstance(value, float):
        raise ValueError(f"{key} must be a size like '8GiB', a share like '40%' or 0, got the float {value!r}")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a size like '8GiB', a share like '40%' or 0, got {type(value).__name__}")
    match = _PATTERN.match(value)
    if match is None:
        raise ValueError(f"{key} must be a size like '8GiB', a share like '40%' or 0, got {value!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        if number > 100:
            raise ValueError(f"{key}={value!r} is a share above 100% of the free GPU memory; use at most '100%'")
        return BudgetSpec("fraction", number / 100.0, value)
    if unit not in _UNITS:
        raise ValueError(
            f"{key}={value!r} has an unknown unit {match.group(2)!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB or %"
        )
    return BudgetSpec("bytes", float(int(number * _UNITS[unit])), value)


def resolve_budget(spec: BudgetSpec, free_bytes: int, key: str = "cache_budget", where: str = "the GPU") -> int:
    """Bytes the cache may use on a GPU with ``free_bytes`` free after the model is placed.

    A share is taken of ``free_bytes``. A byte budget above ``HEADROOM * free_bytes`` (what is left after keeping a
    tenth for activations) is clamped to it with a warning that says by how much.

    Args:
        spec: the parsed budget.
        free_bytes: free memory of the GPU (``torch.cuda.mem_get_info``) with the model on it.
        key: the option's name, for the warning.
        where: the GPU, for the warning (e.g. ``"cuda:0"``).
    """
    if free_bytes < 0:
        raise ValueError(f"free_bytes must be >= 0, got {free_bytes}")
    if spec.kind == "fraction":
        return int(spec.amount * free_bytes)
    wanted = int(spec.amount)
    limit = int(HEADROOM * free_bytes)
    if wanted > limit:
        warnings.warn(
            f"{key}={spec.text!r} ({format_bytes(wanted)}) is more than {where} can hold: {format_bytes(free_bytes)} "
            f"are free after the model was placed, of which {HEADROOM:.0%} may be cached; clamped by "
            f"{format_bytes(wanted - limit)} to {format_bytes(limit)}",
            stacklevel=2,
        )
        return limit
    return wanted


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``"1.50 GiB"``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
