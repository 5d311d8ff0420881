"""``feature_dtype`` for heterogeneous graphs: every featured type's host table cast once at setup (shared segment or
a converted ``mmap`` file per type), ``x`` delivered as ``x_dtype``; ``node_order`` refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.hetero import INST, PAPER, TinyHeteroDataset, make_hetero_data
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.datasets.base import ArrayCache, InputDataError

HALF = [torch.bfloat16, torch.float16]


def _datamodule(dataset=None, **kwargs) -> ZeroCopyHeteroDataModule:
    options = dict(num_neighbors=[3, 2], batch_size=8, num_threads=1)
    options.update(kwargs)
    return ZeroCopyHeteroDataModule(dataset or TinyHeteroDataset(), **options)


class _CachedFiles(TinyHeteroDataset):
    """The tiny graph with each featured type's ``x`` in an ``.npy`` file and an on-disk ``cache`` (where converted
    feature files go, next to it)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.cache = ArrayCache(root / "tiny-hetero")

    def load(self):
        data = super().load()
        for node_type, x in data.x.items():
            path = self.cache.path.parent / f"{node_type}.npy"
            if not path.exists():
                np.save(path, x.numpy())
            data.x_files[node_type] = str(path)
        return data


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("storage", ["shared_memory", "mmap"])
def test_every_featured_table_is_stored_in_the_dtype_and_x_is_its_rows(tmp_path: Path, dtype: torch.dtype,
                                                                        storage: str) -> None:  # fmt: skip
    name = str(dtype).removeprefix("torch.")
    dm = _datamodule(_CachedFiles(tmp_path), feature_dtype=name, feature_storage=storage)
    dm.setup("fit")
    try:
        data = make_hetero_data()
        for node_type in (PAPER, INST):
            table = dm.resources.host.features[node_type]
            assert table.dtype == dtype and torch.equal(table.data, data.x[node_type].to(dtype))
        batch = next(iter(dm.train_dataloader()))
        for node_type in (PAPER, INST):  # x_dtype float32: the stored (rounded) values, cast back
            expected = data.x[node_type].to(dtype).float()[batch[node_type].n_id]
            assert batch[node_type].x.dtype == torch.float32 and torch.equal(batch[node_type].x, expected)
            assert not torch.equal(batch[node_type].x, data.x[node_type][batch[node_type].n_id])  # it did round
    finally:
        dm.teardown("fit")
    if storage == "mmap":  # one converted file per featured type, next to the dataset's cache
        for node_type in (PAPER, INST):
            converted = tmp_path / f"tiny-hetero-x-{name}-v1-{node_type}" / "x.npy"
            assert converted.exists()


def test_x_dtype_null_keeps_the_tables_dtype() -> None:
    dm = _datamodule(feature_dtype="bfloat16", x_dtype=None)
    dm.setup("fit")
    try:
        batch = next(iter(dm.train_dataloader()))
        assert batch[PAPER].x.dtype == torch.bfloat16 and batch[INST].x.dtype == torch.bfloat16
    finally:
        dm.teardown("fit")


def test_mmap_cast_without_a_cache_is_refused_naming_the_key() -> None:
    class _FilesOnly(TinyHeteroDataset):
        def load(self):
            data = super().load()
            data.x_files.update({t: "/nonexistent.npy" for t in data.x})
            return data

    dm = _datamodule(_FilesOnly(), feature_dtype="float16", feature_storage="mmap")
    with pytest.raises(ValueError, match=r"`data.init_args.feature_dtype`='float16' with `feature_storage`='mmap' "
                                         r"needs a dataset with an on-disk cache.*'paper'"):  # fmt: skip
        dm.setup("fit")


def test_a_value_float16_cannot_hold_names_the_type_node_and_key() -> None:
    class _Big(TinyHeteroDataset):
        def load(self):
            data = super().load()
            data.x[INST][5, 2] = 1e6
            return data

    dm = _datamodule(_Big(), feature_dtype="float16")
    with pytest.raises(InputDataError, match=r"features of 'institution': the value 1000000.0 at node 5, column 2 "
                                             r"does not fit float16.*set data.init_args.feature_dtype"):  # fmt: skip
        dm.setup("fit")
    assert dm.resources is None


def test_node_order_and_a_bad_dtype_are_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"data.init_args.node_order='bfs' is not yet supported for heterogeneous"):
        _datamodule(node_order="bfs")
    with pytest.raises(ValueError, match=r"data.init_args.node_order"):
        _datamodule(node_order="random")
    with pytest.raises(ValueError, match=r"data.init_args.feature_dtype"):
        _datamodule(feature_dtype="float64")
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
