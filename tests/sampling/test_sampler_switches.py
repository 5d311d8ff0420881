"""The CUDA sampler's process-wide switches bind through the dispatcher like every op: schemas in csrc/library.cpp,
typed wrappers in lightning_zerocopy.ops, nothing on the ``_C`` module; a build without the CUDA kernels says so."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import WITH_CUDA, _C, ops

SCHEMAS = {
    "set_lean_sampler": "zerocopy::set_lean_sampler(bool enabled) -> bool",
    "set_sampler_graphs": "zerocopy::set_sampler_graphs(bool enabled) -> bool",
    "sampler_graph_stats": "zerocopy::sampler_graph_stats() -> int[]",
}


def test_the_switches_are_ops_of_the_zerocopy_library_only() -> None:
    for name, schema in SCHEMAS.items():
        assert str(getattr(torch.ops.zerocopy, name).default._schema) == schema
        assert not hasattr(_C, name), f"_C.{name}: a second binding route"


@pytest.mark.skipif(WITH_CUDA, reason="the CUDA build runs them (tests/sampling/*_cuda*.py)")
def test_without_the_cuda_kernels_the_wrappers_name_the_rebuild() -> None:
    for call in (lambda: ops.set_lean_sampler(False), lambda: ops.set_sampler_graphs(False), ops.sampler_graph_stats):
        with pytest.raises(RuntimeError, match="built without its CUDA kernels"):
            call()


@pytest.mark.cuda
def test_the_switches_return_the_previous_setting_and_the_counters_are_named() -> None:
    old = ops.set_sampler_graphs(False)
    try:
        assert ops.set_sampler_graphs(True) is False
    finally:
        ops.set_sampler_graphs(old)
    assert set(ops.sampler_graph_stats()) == set(ops.SAMPLER_GRAPH_COUNTERS)
