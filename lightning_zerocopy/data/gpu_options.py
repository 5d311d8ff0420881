"""The DataModule's GPU data-path options: validated naming their YAML keys, and resolved against the trainer.

``gather='auto'`` is decided in ``setup`` (:func:`resolve_gather`), when the trainer's device is known; the values
themselves, and whether this installation can run CUDA kernels at all, are checked when the DataModule is
constructed (:func:`check_gpu_options`), so a bad recipe fails before any data is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from lightning_zerocopy.options import GatherChoice, GatherMode, SamplerPlacement, check_choice, check_count

__all__ = ["KEY_PREFIX", "ResolvedGpuOptions", "check_gpu_options", "cuda_build_problem", "resolve_gather", "resolve_gpu_options"]

#: How the DataModule's arguments are named in errors: the recipe's YAML keys.
KEY_PREFIX = "data.init_args."


def check_gpu_options(sampler_placement: Any, gather: Any, gather_mode: Any, hot_rows: Any) -> None:
    """Validate the GPU data-path options (values, and whether this build can run them), naming the YAML key."""
    check_choice(sampler_placement, SamplerPlacement, KEY_PREFIX + "sampler_placement")
    check_choice(gather, GatherChoice, KEY_PREFIX + "gather")
    check_choice(gather_mode, GatherMode, KEY_PREFIX + "gather_mode")
    check_count(hot_rows, KEY_PREFIX + "hot_rows")
    if hot_rows > 0 and gather == "cpu":
        raise ValueError(
            f"data.init_args.hot_rows={hot_rows} caches rows for the zero-copy gather, but data.init_args.gather='cpu'; "
            "use gather='zerocopy' (or 'auto' on a GPU trainer) or hot_rows=0"
        )
    for key, value, fallback in (("sampler_placement", sampler_placement, "cpu"), ("gather", gather, "cpu")):
        if value in ("uva", "gpu", "zerocopy"):
            problem = cuda_build_problem()
            if problem:
                raise ValueError(f"data.init_args.{key}={value!r} needs a CUDA GPU, but {problem}; use {fallback!r}")


def cuda_build_problem() -> Optional[str]:
    """Why this installation cannot run CUDA kernels at all (checked without creating a CUDA context), or None."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    from lightning_zerocopy import WITH_CUDA

    if not WITH_CUDA:
        return "lightning_zerocopy._C was built without its CUDA kernels (rebuild with FORCE_CUDA=1)"
    return None


def resolve_gather(
    sampler_placement: str, gather: str, hot_rows: int, root: Optional[torch.device]
) -> str:
    """The gather backend (``"cpu"`` or ``"zerocopy"``) for a trainer on ``root`` (``None``: no trainer).

    ``auto`` is ``zerocopy`` on a CUDA trainer whose build has the CUDA kernels, else ``cpu``.

    Raises:
        ValueError: a GPU option where batches cannot be built on a GPU, or ``hot_rows`` without the zero-copy
            gather (naming the ``data.init_args`` key).
    """
    if root is not None:
        on_cuda, where = root.type == "cuda", f"the trainer runs on {root.type!r}"
    else:
        on_cuda, where = torch.cuda.is_available(), "no CUDA GPU is available"
    needs = [f"{KEY_PREFIX}sampler_placement={sampler_placement!r}"] if sampler_placement not in ("cpu", "hybrid", "auto") else []
    if gather == "zerocopy":
        needs.append(f"{KEY_PREFIX}gather='zerocopy'")
    if needs and not on_cuda:
        raise ValueError(
            f"{' and '.join(needs)} build batches on a CUDA GPU, but {where}: run the trainer on a GPU "
            f"(trainer.accelerator='gpu') or use {KEY_PREFIX}sampler_placement='cpu' and "
            f"{KEY_PREFIX}gather='cpu' (or 'auto')"
        )
    resolved = gather
    if gather == "auto":
        from lightning_zerocopy import WITH_CUDA

        resolved = "zerocopy" if on_cuda and root is not None and WITH_CUDA else "cpu"
        if on_cuda and root is not None and not WITH_CUDA:
            rank_zero_warn(
                f"{KEY_PREFIX}gather='auto' falls back to 'cpu': lightning_zerocopy._C was built without its "
                "CUDA kernels (rebuild with FORCE_CUDA=1 for the zero-copy gather)"
            )
    if resolved == "cpu" and hot_rows > 0:
        raise ValueError(
            f"{KEY_PREFIX}hot_rows={hot_rows} caches rows for the zero-copy gather, but "
            f"{KEY_PREFIX}gather={gather!r} resolves to 'cpu' here ({where if not on_cuda else 'no CUDA kernels'});"
            " set hot_rows=0 or run the zero-copy gather on a GPU trainer"
        )
    return resolved


def resolve_placement(sampler_placement: SamplerPlacement, root: Optional[torch.device]) -> str:
    """``sampler_placement`` as it runs under a trainer on ``root``: ``hybrid``/``auto`` need a CUDA trainer and
    the CUDA kernels, and fall back to ``cpu`` with a one-line note otherwise; other values are kept."""
    if sampler_placement not in ("hybrid", "auto"):
        return sampler_placement
    on_cuda = root.type == "cuda" if root is not None else torch.cuda.is_available()
    problem = None
    if not on_cuda:
        problem = f"the trainer runs on {root.type!r}" if root is not None else "no CUDA GPU is available"
    elif cuda_build_problem() is not None:
        problem = "lightning_zerocopy._C was built without its CUDA kernels"
    if problem is None:
        return sampler_placement
    rank_zero_info(f"{KEY_PREFIX}sampler_placement={sampler_placement!r}: {problem}, so sampling runs on the CPU only")
    return "cpu"


@dataclass(frozen=True)
class ResolvedGpuOptions:
    """The GPU options as they run under a trainer (decided in the DataModule's ``setup``).

    Attributes:
        placement: ``sampler_placement`` after :func:`resolve_placement` (``hybrid``/``auto`` may become ``cpu``).
        gather: ``"cpu"`` or ``"zerocopy"`` (:func:`resolve_gather`).
        device_index: the trainer's CUDA device, or ``None`` for a CPU trainer.
    """

    placement: str
    gather: str
    device_index: Optional[int]

    @property
    def batch_device_type(self) -> str:
        """``"cuda"`` when batches are built on the GPU (a GPU sampler or the zero-copy gather), else ``"cpu"``."""
        return "cuda" if self.placement != "cpu" or self.gather == "zerocopy" else "cpu"


def resolve_gpu_options(
    sampler_placement: SamplerPlacement, gather: GatherChoice, hot_rows: int, root: Optional[torch.device]
) -> ResolvedGpuOptions:
    """The options as they run under a trainer whose root device is ``root`` (``None``: no trainer)."""
    placement = resolve_placement(sampler_placement, root)
    return ResolvedGpuOptions(
        placement=placement,
        gather=resolve_gather(placement, gather, hot_rows, root),
        device_index=root.index if root is not None and root.type == "cuda" else None,
    )
