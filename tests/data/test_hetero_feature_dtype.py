"""``feature_dtype`` for heterogeneous graphs: ``node_order`` refused in one line, and on a GPU every batch reads each
type's cast table (the tables, files, batches and errors on the CPU: test_feature_dtype.py, for both graph kinds)."""

from __future__ import annotations

import pytest
import torch

from helpers.hetero import INST, PAPER, TinyHeteroDataset
from lightning_zerocopy import ZeroCopyHeteroDataModule


def _datamodule(dataset=None, **kwargs) -> ZeroCopyHeteroDataModule:
    options = dict(num_neighbors=[3, 2], batch_size=8, num_threads=1)
    options.update(kwargs)
    return ZeroCopyHeteroDataModule(dataset or TinyHeteroDataset(), **options)


def test_node_order_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"data.init_args.node_order='bfs' is not yet supported for heterogeneous"):
        _datamodule(node_order="bfs")
    with pytest.raises(ValueError, match=r"data.init_args.node_order"):
        _datamodule(node_order="random")
    assert _datamodule(node_order="none").node_order == "none"


@pytest.mark.cuda
@pytest.mark.parametrize("placement, gather", [("cpu", "zerocopy"), ("uva", "zerocopy"), ("gpu", "cpu")])
def test_gpu_batches_read_the_cast_tables(placement: str, gather: str) -> None:
    """The zero-copy gather (or a CPU gather of GPU-sampled ids) reads each type's half table: ``x`` on the GPU is
    the CPU batch's, bitwise, in ``x_dtype`` and in the table's dtype."""
    for x_dtype, want in (("float32", torch.float32), (None, torch.float16)):
        dm = _datamodule(feature_dtype="float16", x_dtype=x_dtype, sampler_placement=placement, gather=gather)
        dm.setup("fit")
        try:
            item = dm.plan("train").item(0, 0)
            gpu = dm.builder("train").open(dm.resources).build_batch(item)
            cpu_builder = dm.builder("train")
            cpu_builder.sampler_placement = cpu_builder.gpu_sampler_placement = "cpu"
            cpu_builder.gather = "cpu"
            cpu = cpu_builder.open(dm.resources).build_batch(item)
            cpu_builder.close()
            for node_type in (PAPER, INST):
                assert gpu[node_type].x.is_cuda and gpu[node_type].x.dtype == want
                assert torch.equal(gpu[node_type].x.cpu(), cpu[node_type].x)
        finally:
            dm.teardown("fit")
