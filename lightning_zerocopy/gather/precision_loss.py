"""What a cast of features to a half dtype loses at the small end: values that become 0 or subnormal.

``float16`` holds normal values down to 6.1e-05 and subnormal ones (with fewer significant bits) down to 6e-08;
below that a value becomes 0. Features of magnitude ~1e-9 stored as ``float16`` are all 0: the model trains on
nothing, without a word. :class:`PrecisionLoss` counts, chunk by chunk as a table is cast, the nonzero finite values
that become 0 or subnormal; :meth:`PrecisionLoss.check` then warns, naming the count and the fix, when some value
became 0, and refuses the cast (:class:`FeatureUnderflowError`) when more than :data:`REFUSE_SHARE` of the nonzero
values became 0 or subnormal. ``bfloat16`` has ``float32``'s exponent range, so it keeps such values (with fewer
significant bits): it is the fix named for ``float16``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["REFUSE_SHARE", "FeatureRangeError", "FeatureUnderflowError", "PrecisionLoss", "underflow_fix"]

#: Above this share of the nonzero values becoming 0 or subnormal, a cast is refused rather than warned about (a
#: Gaussian feature table loses about 5e-5 of its values to float16's subnormal range).
REFUSE_SHARE = 0.01


class FeatureRangeError(ValueError):
    """A feature value that the dtype a table or a batch is cast to cannot hold (too large, or too small)."""


def underflow_fix(dtype: torch.dtype, key: str) -> str:
    """What to set when ``dtype`` cannot hold the values: ``bfloat16`` (float32's range) for ``float16``, else
    ``float32``."""
    if dtype == torch.float16:
        return f"set {key} to bfloat16 (float32's range) or float32"
    return f"set {key} to float32"


@dataclass
class PrecisionLoss:
    """Counts of the nonzero finite source values a cast turned into 0 or a subnormal value.

    Attributes:
        nonzero: nonzero finite source values seen.
        zeroed: those that became 0.
        subnormal: those that became subnormal (kept with fewer significant bits).
        first: ``(row, column, value)`` of the first that became 0 or subnormal.
    """

    nonzero: int = 0
    zeroed: int = 0
    subnormal: int = 0
    first: Optional[tuple[int, int, float]] = None

    @property
    def lost(self) -> int:
        """Values that became 0 or subnormal."""
        return self.zeroed + self.subnormal

    def count(self, src: torch.Tensor, out: torch.Tensor, first_row: int) -> None:
        """Count what casting the chunk ``src`` (rows ``first_row, ...`` of the table) into ``out`` lost."""
        if not out.is_floating_point() or not src.is_floating_point() or out.dtype == src.dtype or src.numel() == 0:
            return
        nonzero = (src != 0) & torch.isfinite(src)
        self.nonzero += int(nonzero.sum())
        small = nonzero & (out.abs() < torch.finfo(out.dtype).tiny)
        lost = int(small.sum())
        if lost == 0:
            return
        zeroed = int((small & (out == 0)).sum())
        self.zeroed += zeroed
        self.subnormal += lost - zeroed
        if self.first is None:
            row, column = (int(v) for v in small.reshape(small.shape[0], -1).nonzero()[0])
            self.first = (first_row + row, column, float(src[row].reshape(-1)[column]))

    def check(self, what: str, dtype: torch.dtype, key: str) -> None:
        """Refuse (more than :data:`REFUSE_SHARE` of the nonzero values lost) or warn (some value became 0).

        Raises:
            FeatureUnderflowError: naming the count, the first value and ``key``'s fix.
        """
        if self.nonzero and self.lost > REFUSE_SHARE * self.nonzero:
            raise FeatureUnderflowError(what, self, dtype, key)
        if self.zeroed:
            described = self._describe(dtype, zeroed_only=True)
            warnings.warn(f"{what}: {described}; {underflow_fix(dtype, key)} to keep them", UserWarning, stacklevel=3)

    def _describe(self, dtype: torch.dtype, zeroed_only: bool = False) -> str:
        name = str(dtype).removeprefix("torch.")
        count = self.zeroed if zeroed_only else self.lost
        became = "become 0" if zeroed_only else f"become 0 or subnormal (below {torch.finfo(dtype).tiny:.2g})"
        row, column, value = self.first if self.first is not None else (0, 0, 0.0)
        share = count / max(1, self.nonzero)
        return (f"{count:,} of {self.nonzero:,} nonzero values ({share:.2%}) {became} in {name} (e.g. {value:.3g} "
                f"at node {row}, column {column})")  # fmt: skip


class FeatureUnderflowError(FeatureRangeError):
    """Too many feature values become 0 or subnormal in the dtype a table or batch is cast to.

    Attributes:
        loss: the counts (:class:`PrecisionLoss`).
    """

    def __init__(self, what: str, loss: PrecisionLoss, dtype: torch.dtype, key: str) -> None:
        self.loss = loss
        super().__init__(f"{what}: {loss._describe(dtype)}, which changes what the model sees; "
                         f"{underflow_fix(dtype, key)}")  # fmt: skip
