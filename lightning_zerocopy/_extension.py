"""Loads the compiled extension ``lightning_zerocopy._C`` and checks it matches the running torch."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

REBUILD_HINT = (
    "Rebuild it against the installed torch from the repository root with:\n"
    "    pip install --no-build-isolation -e .\n"
    "(or `python setup.py build_ext --inplace`)."
)


def _base_version(version: str) -> str:
    return version.split("+")[0]


def load_extension() -> ModuleType:
    """Import ``lightning_zerocopy._C``, registering the ``torch.ops.zerocopy`` ops.

    Raises:
        ImportError: if the extension is missing or was built against a different torch, with the command
            that rebuilds it.
    """
    try:
        module = importlib.import_module("lightning_zerocopy._C")
    except ImportError as exc:
        raise ImportError(
            f"lightning_zerocopy's compiled extension (_C) could not be loaded: {exc}.\n"
            f"It is missing or was built against another torch than the installed {torch.__version__}. "
            + REBUILD_HINT
        ) from exc
    built = getattr(module, "torch_version", "unknown")
    if _base_version(built) != _base_version(torch.__version__):
        raise ImportError(
            f"lightning_zerocopy._C was built against torch {built}, but torch {torch.__version__} is "
            "installed. " + REBUILD_HINT
        )
    return module


_C = load_extension()

#: True when the extension was compiled with its CUDA kernels.
WITH_CUDA: bool = bool(_C.with_cuda)
