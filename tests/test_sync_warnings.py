"""The sync counter of the CUDA no-sync tests counts synchronizations, not torch's one-time prototype notice."""

from __future__ import annotations

import warnings

from helpers import SYNC_WARNING, sync_warnings


def test_the_prototype_notice_is_no_synchronization_and_a_synchronizing_op_is_one() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # what torch says once per process at the first set_sync_debug_mode (it ran first in an xdist worker)
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                      "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1)")  # fmt: skip
        warnings.warn(f"{SYNC_WARNING} (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:1)")
    found = sync_warnings(caught)
    assert len(found) == 1 and SYNC_WARNING in found[0] and __file__ in found[0]
