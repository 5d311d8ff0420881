"""Round the row count of every linear layer's matrix product up to a multiple, so sampled batches repeat shapes.

cuBLAS chooses an algorithm per problem shape on the host, and keeps its choices in a heuristics cache. A shape it has
not seen cost ~109 µs of host time per product on an H200, against ~15 µs for a seen one
(``benchmarks.parts.gemm_shapes``, 2026-11-29). Sampled batches have row counts of their own. The heavy GraphSAGE's
products run on three of them a step, which took 542, 1,988 and 2,526 distinct values over 3,000 batches of a 1M-node
graph (``benchmarks.parts.shape_recurrence``). With cuBLAS's default cache of 8,192 entries, about 31 % of its
products found their shape. Rounded up to a multiple of 64, the counts took 15, 91 and 217 values, and 99.4 % would
(simulated). This is the data phase's extra host time on two GPUs (``docs/PERFORMANCE.md``).

:class:`GemmRowBuckets` pads the input of each ``torch.nn.Linear`` and PyG ``Linear`` of the LightningModule with zero
rows up to the multiple, and hands the layer's output back narrowed to the real rows. The batch is unchanged, and the
real rows' outputs are the products of the same rows; only the product's shape differs, which may change how cuBLAS
orders its sums (so results may differ in the last bits). The cost is one copy of each layer's input on the GPU.
On 2 x H200 (2026-11-30, the heavy model, two ranks, the worker under MPS) a rank trained 109 steps/s on sampled
batches with multiple 64 against 85 without; on a ring of repeating shapes it lost 3.6 %. ``recipes/multi_gpu.yaml``
turns it on; elsewhere it is opt-in.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

__all__ = ["GemmRowBuckets", "pad_linear_rows"]


class _RowPadding:
    """The forward hooks of one multiple: pad before the layer, narrow after it (a per-thread stack of real row
    counts, so a layer called again inside its own forward, or from another thread, pairs its own calls)."""

    def __init__(self, multiple: int) -> None:
        self.multiple = multiple
        self._rows = threading.local()

    def _stack(self) -> list[Optional[int]]:
        stack = getattr(self._rows, "stack", None)
        if stack is None:
            stack = self._rows.stack = []
        return stack

    def before(self, module: torch.nn.Module, args: tuple[Any, ...]) -> Optional[tuple[Any, ...]]:
        x = args[0] if args else None
        pad = (-x.shape[0]) % self.multiple if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
        self._stack().append(x.shape[0] if pad else None)
        if not pad:
            return None
        return (F.pad(x, (0, 0, 0, pad)), *args[1:])

    def after(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        rows = self._stack().pop()
        return output if rows is None else output[:rows]


def _checked(multiple: Any) -> int:
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"GemmRowBuckets: multiple must be a whole number >= 1 (64 is a good start), got {multiple!r}")
    return multiple


def _linear_types() -> tuple[type, ...]:
    types: list[type] = [torch.nn.Linear]
    try:
        from torch_geometric.nn.dense.linear import Linear as PygLinear
    except ImportError:  # PyG absent: torch's layers only
        return tuple(types)
    return (*types, PygLinear)


def pad_linear_rows(module: torch.nn.Module, multiple: int) -> list[RemovableHandle]:
    """Pad the 2-D input of every ``torch.nn.Linear`` and PyG ``Linear`` inside ``module`` with zero rows up to a
    multiple of ``multiple``, and narrow each output back to the real rows (see the module docstring). Returns the
    hooks' handles: ``handle.remove()`` undoes it. Inputs of other ranks than 2 are left as they are."""
    padding = _RowPadding(_checked(multiple))
    types = _linear_types()
    handles: list[RemovableHandle] = []
    for layer in module.modules():
        if isinstance(layer, types):
            handles.append(layer.register_forward_pre_hook(padding.before))
            handles.append(layer.register_forward_hook(padding.after))
    return handles


class GemmRowBuckets(Callback):
    """Opt-in: the LightningModule's linear layers run their matrix products on row counts rounded up to
    ``multiple``, so cuBLAS meets the same few shapes again instead of a new one most steps (see the module
    docstring). In a recipe::

        trainer:
          callbacks:
            - class_path: lightning_zerocopy.callbacks.GemmRowBuckets
              init_args: {multiple: 64}

    Args:
        multiple: the row-count bucket; 64 brought the simulated hit rate to 99.4 % for the heavy model.
    """

    def __init__(self, multiple: int = 64) -> None:
        self.multiple = _checked(multiple)
        self._handles: list[RemovableHandle] = []

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if not self._handles:
            self._handles = pad_linear_rows(pl_module, self.multiple)

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def layers(self) -> int:
        """How many linear layers it pads now."""
        return len(self._handles) // 2
