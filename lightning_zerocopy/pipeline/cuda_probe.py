"""Whether this process has initialized the CUDA driver, found out without initializing it.

Standard library only (``ctypes``), so it can be asked before torch touches CUDA.
"""

from __future__ import annotations

import os

__all__ = ["cuda_driver_initialized"]


def cuda_driver_initialized() -> bool:
    """Whether this process has initialized the CUDA driver (``cuInit``), found out without initializing it.

    A process whose driver was initialized before the daemon started does not become an MPS client, whatever
    its environment says later. ``import torch``, ``import pytorch_lightning`` and ``torch.cuda.device_count()``
    leave the driver uninitialized; ``import torch_geometric`` initializes it, so ``torch.cuda.is_initialized()``
    can be False while it is too late (``docs/BENCHMARK_NOTES.md``, "When does a process become an MPS client?").
    """
    import ctypes

    try:  # RTLD_NOLOAD: a handle only if this process has loaded the driver already; never load it here
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        get_current = driver.cuCtxGetCurrent
    except (OSError, AttributeError):
        return False
    context = ctypes.c_void_p()
    return get_current(ctypes.byref(context)) != 3  # CUDA_ERROR_NOT_INITIALIZED: cuInit has not run
