"""``feature_dtype``: the host feature table stored as bfloat16/float16 (half the bytes), ``x`` delivered as ``x_dtype``.

CPU tests cover the cast at host-copy build (shared segment, node orders, the ``mmap`` converted file and its cache
key), the CPU batch paths (``x`` bitwise ``features.to(dtype).float()``), the DataModule option end to end (setup,
loaders, a fit, the pipeline) and its errors. CUDA tests (``@pytest.mark.cuda``) check the zero-copy gather paths
(plain, hot rows, the Strategy's shards, a CPU gather of GPU-sampled ids) against the same reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers.kinds import NODE_KINDS, nodes

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.host.disk_cache import feature_cache_dir
from lightning_zerocopy.data.host.share import share_node_data, type_feature_dir, typed_arrays
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.data.resources import DeviceResources
from lightning_zerocopy.data.stage_bounds import h2d_bandwidth, time_sampling
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.datasets.base import ArrayCache, InputDataError, NodeData
from lightning_zerocopy.gather.host_table import (
    FeatureOverflowError,
    HostFeatureTable,
    cast_rows_into,
    feature_dtype_of,
)
from lightning_zerocopy.models import GraphSAGE

HALF = [torch.bfloat16, torch.float16]
NUM_NODES, NUM_EDGES, FEATURES = 800, 6000, 12


def _graph(seed: int = 3) -> NodeData:
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(NUM_NODES, generator=gen)
    return NodeData(
        edge_index=torch.randint(0, NUM_NODES, (2, NUM_EDGES), generator=gen),
        x=torch.randn(NUM_NODES, FEATURES, generator=gen) * 3,  # values that bf16/fp16 round differently
        y=torch.randint(0, 5, (NUM_NODES,), generator=gen),
        train_idx=perm[:500].sort().values,
        val_idx=perm[500:650].sort().values,
        test_idx=perm[650:].sort().values,
    )


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


# ---- the host table ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_a_shared_table_is_cast_once_into_a_segment_of_half_the_bytes(dtype):
    x = _graph().x
    full = HostFeatureTable.share(x)
    half = HostFeatureTable.share(x, dtype=dtype)
    try:
        assert half.dtype == dtype and torch.equal(half.data, x.to(dtype))
        assert _nbytes(half.data) * 2 == _nbytes(full.data) == x.numel() * 4
        assert half.row_bytes * 2 == full.row_bytes
    finally:
        full.unlink()
        half.unlink()


def test_a_value_the_dtype_cannot_hold_is_named_and_nan_is_copied():
    x = torch.randn(100, 6)
    x[37, 4] = 1e6  # above float16's 65504
    with pytest.raises(FeatureOverflowError, match=r"node 37, column 4 does not fit float16.*data\.init_args\.feature_dtype"):
        cast_rows_into(x, torch.empty(100, 6, dtype=torch.float16), key="data.init_args.feature_dtype")
    assert torch.equal(cast_rows_into(x, torch.empty(100, 6, dtype=torch.bfloat16)), x.to(torch.bfloat16))
    x[37, 4], x[5, 0] = 2.0, float("nan")  # non-finite in the source is the NaN scan's business, not an overflow
    out = cast_rows_into(x, torch.empty(100, 6, dtype=torch.float16))
    assert out[5, 0].isnan() and torch.equal(out[6:], x[6:].half())


def test_feature_dtype_names_map_to_torch_and_bad_ones_name_the_key():
    assert feature_dtype_of("bfloat16") is torch.bfloat16 and feature_dtype_of(torch.float16) is torch.float16
    with pytest.raises(ValueError, match=r"data\.init_args\.feature_dtype must be 'float32', 'bfloat16' or 'float16'"):
        feature_dtype_of("float64", "data.init_args.feature_dtype")


# ---- the host copy -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("node_order", ["none", "bfs"])
@pytest.mark.parametrize("dtype", HALF)
def test_share_node_data_stores_the_features_cast(dtype, node_order):
    """In the dataset's order or relabeled in memory: the table is the dataset's rows, cast, in the stored order."""
    data = _graph()
    handles = share_node_data(data, node_order=node_order, feature_dtype=dtype)
    try:
        table = handles.features.open()
        rows = torch.arange(NUM_NODES) if handles.node_order is None else handles.node_order.order.open()
        assert table.dtype == dtype and torch.equal(table.data, data.x[rows].to(dtype))
    finally:
        handles.unlink()


def test_mmap_maps_a_converted_file_whose_cache_directory_names_the_dtype(tmp_path):
    data = _graph()
    source = tmp_path / "x.npy"
    import numpy as np

    np.save(source, data.x.numpy())
    data.x_file = str(source)
    with pytest.raises(ValueError, match=r"`feature_dtype`='bfloat16' with `feature_storage`='mmap' needs a dataset"):
        share_node_data(data, "mmap", feature_dtype=torch.bfloat16)
    feature_dir = tmp_path / "features-x-bfloat16-v1"
    handles = share_node_data(data, "mmap", feature_dtype=torch.bfloat16, feature_dir=feature_dir)
    try:
        table = handles.features.open()
        assert Path(handles.features.data.path).parent == feature_dir  # the converted copy, not the dataset's file
        assert table.dtype == torch.bfloat16 and torch.equal(table.data, data.x.to(torch.bfloat16))
        stamp = (feature_dir / "x.npy").stat().st_mtime_ns
        again = share_node_data(data, "mmap", feature_dtype=torch.bfloat16, feature_dir=feature_dir)
        assert (feature_dir / "x.npy").stat().st_mtime_ns == stamp  # built once
        again.unlink()
        same = share_node_data(data, "mmap", feature_dtype=torch.float32, feature_dir=tmp_path / "unused")
        assert same.features.data.path == str(source) and not (tmp_path / "unused").exists()  # nothing to convert
        same.unlink()
    finally:
        handles.unlink()


def test_the_converted_files_cache_key_holds_the_dtype_and_the_node_order(tmp_path):
    dataset = SyntheticGraph(num_nodes=300, avg_degree=4, num_features=8, num_classes=3, cache_dir=str(tmp_path))
    assert feature_cache_dir(dataset, "none", None) is None
    plain = feature_cache_dir(dataset, "none", torch.bfloat16)
    assert plain.name == f"{dataset.cache.path.name}-x-bfloat16-v1" and plain.parent == dataset.cache.path.parent
    ordered = feature_cache_dir(dataset, "bfs", torch.float16)
    assert ordered.name == f"{dataset.cache.path.name}-order-bfs-v1-x-float16-v1"
    assert len({plain, ordered, feature_cache_dir(dataset, "none", torch.float16)}) == 3


# ---- the batch builder -------------------------------------------------------------------------------------------


@pytest.fixture(params=HALF, ids=["bfloat16", "float16"])
def half_shared(request):
    data = _graph()
    handles = share_node_data(data, feature_dtype=request.param)
    yield data, handles, request.param
    handles.unlink()


def test_the_cpu_builder_delivers_float32_x_bitwise_the_cast_rows(half_shared):
    data, handles, dtype = half_shared
    plan = BatchPlan(data.train_idx, 64, shuffle=True, seed=5)
    as_float = BatchBuilder(handles, [5, 3]).open()
    as_stored = BatchBuilder(handles, [5, 3], x_dtype=None).open()
    other = "float16" if dtype == torch.bfloat16 else "bfloat16"
    as_other = BatchBuilder(handles, [5, 3], x_dtype=other).open()
    try:
        for step in range(3):
            item = plan.item(0, step)
            batch = as_float.build_batch(item)
            want = data.x[batch.n_id].to(dtype)
            assert batch.x.dtype == torch.float32 and torch.equal(batch.x, want.float())
            stored = as_stored.build_batch(item)
            assert stored.x.dtype == dtype and torch.equal(stored.x, want) and torch.equal(stored.n_id, batch.n_id)
            assert torch.equal(as_other.build_batch(item).x, want.to(feature_dtype_of(other)))
            out = {"x": torch.full((as_float.max_nodes(64), FEATURES), float("nan"))}
            written = as_float.build_batch(item, out=out)
            assert written.x.data_ptr() == out["x"].data_ptr() and torch.equal(written.x, want.float())
    finally:
        for builder in (as_float, as_stored, as_other):
            builder.close()


def test_the_builder_marks_the_gather_with_the_bytes_of_the_stored_rows(half_shared):
    data, handles, _ = half_shared
    builder = BatchBuilder(handles, [5, 3]).open()
    marks: list[tuple[str, int]] = []

    class Marks:
        def mark(self, stage: str, nbytes: int = 0) -> None:
            marks.append((stage, nbytes))

    try:
        item = BatchPlan(data.train_idx, 32, seed=1).item(0, 0)
        batch = builder.gather_batch(builder.sample_batch(item), marks=Marks())
        assert marks == [("gather", batch.n_id.numel() * FEATURES * 2)]  # 2 bytes a value, whatever x_dtype is
    finally:
        builder.close()


def test_x_dtype_is_checked_and_pickled():
    import pickle

    data = _graph()
    handles = share_node_data(data)
    try:
        with pytest.raises(ValueError, match="`x_dtype` must be"):
            BatchBuilder(handles, [5], x_dtype="float64")
        builder = pickle.loads(pickle.dumps(BatchBuilder(handles, [5], x_dtype="bfloat16")))
        assert builder.x_dtype == "bfloat16" and "x_dtype='bfloat16'" in repr(builder)
    finally:
        handles.unlink()


# ---- the DataModule ----------------------------------------------------------------------------------------------


def _dataset(root: Path) -> SyntheticGraph:
    return SyntheticGraph(num_nodes=1200, avg_degree=6, num_features=16, num_classes=4, cache_dir=str(root / "cache"))


def _with_files(kind, root: Path):
    """The kind's tiny dataset with each featured type's ``x`` in an ``.npy`` file and an on-disk ``cache`` (where
    node-order caches and converted feature files go, next to it)."""
    dataset = kind.dataset()
    dataset.cache = ArrayCache(root / "tiny")
    data = dataset.load()  # the dataset's one object: the file names stay on it
    for node_type, x in typed_arrays(data).x.items():
        path = root / f"{node_type}.npy"
        np.save(path, x.numpy())
        if kind.typed:
            data.x_files[node_type] = str(path)
        else:
            data.x_file = str(path)
    return dataset


def _first_batches(dm, count: int = 3) -> list:
    batches = []
    for batch in dm.train_dataloader():
        batches.append(batch)
        if len(batches) == count:
            break
    return batches


_DM_CASES = [("shared_memory", "none", "bfloat16"), ("shared_memory", "none", "float16"), ("shared_memory", "bfs", "float16"),
             ("mmap", "none", "float16"), ("mmap", "none", "bfloat16"), ("mmap", "degree", "bfloat16")]  # fmt: skip


@pytest.mark.parametrize(
    "kind, feature_storage, node_order, dtype",
    [(k, *case) for k in NODE_KINDS for case in _DM_CASES if not k.typed or case[1] == "none"],  # typed: no node order
    ids=lambda v: str(v),
)
def test_the_datamodule_stores_every_featured_table_half_and_delivers_float32(tmp_path, kind, feature_storage,
                                                                              node_order, dtype):  # fmt: skip
    dataset = _with_files(kind, tmp_path)
    view, half = typed_arrays(dataset.load()), feature_dtype_of(dtype)
    kwargs = dict(feature_storage=feature_storage, node_order=node_order)
    reference = kind.datamodule(dataset, **kwargs)
    dm = kind.datamodule(dataset, feature_dtype=dtype, **kwargs)
    dm.prepare_data()
    reference.prepare_data()
    dm.setup("fit")
    reference.setup("fit")
    try:
        for node_type in view.x:
            stored, full = dm.resources.host.tables[node_type].data, reference.resources.host.tables[node_type].data
            assert stored.dtype == half and _nbytes(stored) * 2 == _nbytes(full)  # half the shared bytes
            assert node_order != "none" or torch.equal(stored, view.x[node_type].to(half))
            if feature_storage == "mmap":  # one converted file per featured type, next to the dataset's cache
                folder = type_feature_dir(feature_cache_dir(dataset, node_order, half), view.schema, node_type)
                assert (folder / "x.npy").is_file() and folder.parent == tmp_path
        for batch, unrounded in zip(_first_batches(dm), _first_batches(reference)):
            for node_type, store in nodes(batch).items():
                assert torch.equal(store.n_id, nodes(unrounded)[node_type].n_id)  # the same batches, only x rounded
                if node_type in view.x:
                    want = view.x[node_type][store.n_id]
                    assert store.x.dtype == torch.float32 and torch.equal(store.x, want.to(half).float())
                    assert not torch.equal(store.x, want)  # it did round
                    torch.testing.assert_close(store.x, nodes(unrounded)[node_type].x, rtol=1e-2, atol=1e-2)
    finally:
        dm.teardown("fit")
        reference.teardown("fit")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_x_dtype_null_keeps_the_stored_dtype(kind):
    dm = kind.datamodule(feature_dtype="bfloat16", x_dtype=None)
    dm.setup("fit")
    try:
        featured = [s for s in nodes(_first_batches(dm, 1)[0]).values() if "x" in s]
        assert len(featured) == (2 if kind.typed else 1) and all(s.x.dtype == torch.bfloat16 for s in featured)
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("key, value", [("feature_dtype", "float64"), ("x_dtype", "half"), ("feature_dtype", 16)])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_a_bad_dtype_is_one_line_naming_its_key(kind, key, value):
    with pytest.raises(ValueError) as info:
        kind.datamodule(**{key: value})
    message = str(info.value)
    assert message.startswith(f"data.init_args.{key} must be 'float32', 'bfloat16' or 'float16'") and "\n" not in message


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_a_feature_float16_cannot_hold_fails_the_setup_naming_type_node_and_key(kind):
    dataset = kind.dataset()
    last = list(typed_arrays(dataset.load()).x)[-1]
    typed_arrays(dataset.load()).x[last][5, 2] = 1e6  # the dataset's one object
    dm = kind.datamodule(dataset, feature_dtype="float16")
    what = f"features of {last!r}: " if kind.typed else "features: "
    with pytest.raises(InputDataError, match=re.escape(what) + r"the value 1000000.0 at node 5, column 2 does not fit "
                                             r"float16.*set data\.init_args\.feature_dtype"):  # fmt: skip
        dm.setup("fit")
    assert dm.resources is None


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_mmap_cast_without_a_cache_is_refused_naming_the_key(tmp_path, kind):
    dataset = _with_files(kind, tmp_path)
    del dataset.cache  # the files, but nowhere to put a converted one
    dm = kind.datamodule(dataset, feature_dtype="float16", feature_storage="mmap")
    with pytest.raises(ValueError, match=r"`data.init_args.feature_dtype`='float16' with `feature_storage`='mmap' "
                                         r"needs a dataset with an on-disk cache"):  # fmt: skip
        dm.setup("fit")


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_float32_model_fits_on_bfloat16_features(tmp_path, pipeline):
    pl.seed_everything(0)
    dm = ZeroCopyDataModule(_dataset(tmp_path), fanouts=[5, 5], batch_size=128, feature_dtype="bfloat16")
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16, dropout=0.0)
    callbacks = [PipelineCallback(mode="in_process")] if pipeline else []
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=4, limit_val_batches=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), callbacks=callbacks)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    loss = trainer.callback_metrics.get("train_loss")  # handed over at the epoch's last batch
    assert loss is not None and torch.isfinite(loss)


# ---- the sampling bound ------------------------------------------------------------------------------------------


def test_time_sampling_times_a_cpu_builder_alone(half_shared):
    data, handles, _ = half_shared
    builder = BatchBuilder(handles, [5, 3])
    plan = BatchPlan(data.train_idx, 64, seed=2)
    try:
        ms = time_sampling(builder, plan, batches=4, warmup=1)
        assert isinstance(ms, float) and ms > 0
        with pytest.raises(ValueError, match="`batches` must be >= 1"):
            time_sampling(builder, plan, batches=0)
    finally:
        builder.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without a CUDA GPU")
def test_no_pcie_bandwidth_without_a_gpu():
    assert h2d_bandwidth() is None


# ---- CUDA: the zero-copy gather paths ----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize(
    "kwargs",
    [dict(sampler_placement="gpu", gather="zerocopy"), dict(sampler_placement="cpu", gather="zerocopy"),
     dict(sampler_placement="uva", gather="zerocopy", gather_mode="sorted"),
     dict(sampler_placement="gpu", gather="zerocopy", hot_rows=200), dict(sampler_placement="gpu", gather="cpu")],
)  # fmt: skip
def test_gpu_builders_gather_the_stored_dtype_and_cast_on_the_gpu(half_shared, kwargs):
    data, handles, dtype = half_shared
    resources = DeviceResources(handles, 0)
    builder = BatchBuilder(handles, [5, 3], **kwargs).open(resources)
    stored = BatchBuilder(handles, [5, 3], x_dtype=None, **kwargs).open(resources)
    reference = BatchBuilder(handles, [5, 3]).open()
    plan = BatchPlan(data.train_idx, 64, shuffle=True, seed=7)
    try:
        for table in (builder._gpu.features or {}).values():  # one zero-copy table per featured node type
            assert table.dtype == dtype  # the GPU side (and its hot rows) hold the stored dtype
            cache = getattr(table, "_cache", None)
            assert cache is None or cache.dtype == dtype
        for step in range(3):
            item = plan.item(0, step)
            batch = builder.build_batch(item)
            assert batch.x.is_cuda and batch.x.dtype == torch.float32
            want = data.x[batch.n_id.cpu()].to(dtype)
            assert torch.equal(batch.x.cpu(), want.float())
            assert torch.equal(batch.x.cpu(), reference.build_batch(item).x)  # same as the CPU path, bitwise
            kept = stored.build_batch(item)
            assert kept.x.dtype == dtype and torch.equal(kept.x.cpu(), want)
            out = {"x": torch.full((builder.max_nodes(64), FEATURES), float("nan"), device="cuda:0")}
            written = builder.build_batch(item, out=out)
            assert written.x.data_ptr() == out["x"].data_ptr() and torch.equal(written.x.cpu(), want.float())
    finally:
        for b in (builder, stored, reference):
            b.close()
        resources.close()


@pytest.mark.cuda
def test_the_strategys_shards_hold_the_stored_dtype(half_shared):
    from lightning_zerocopy.gather import CachePlan, FeatureCacheSpec, fill_shard

    data, handles, dtype = half_shared
    resources = DeviceResources(handles, 0)
    try:
        table = resources.registered_features()
        plan = CachePlan.from_ranking(torch.randperm(NUM_NODES), NUM_NODES, 2, num_rows=300)
        shards = [fill_shard(plan, s, table, torch.device("cuda", 0)) for s in range(2)]
        assert all(shard.dtype == dtype for shard, _ in shards)
        spec = FeatureCacheSpec(plan, tuple(h for _, h in shards), policy="clique")
        builder = BatchBuilder(handles, [5, 3], gather="zerocopy", cache=spec).open(resources)
        item = BatchPlan(data.train_idx, 64, seed=4).item(0, 0)
        batch = builder.build_batch(item)
        assert batch.x.dtype == torch.float32
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id.cpu()].to(dtype).float())
        builder.close()
    finally:
        resources.close()


@pytest.mark.cuda
def test_a_gpu_datamodule_fits_on_bfloat16_features_with_the_worker_pipeline(tmp_path):
    pl.seed_everything(0)
    dm = ZeroCopyDataModule(_dataset(tmp_path), fanouts=[5, 5], batch_size=128, feature_dtype="bfloat16",
                            sampler_placement="gpu", gather="zerocopy", hot_rows=100)  # fmt: skip
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16, dropout=0.0)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, limit_train_batches=4, limit_val_batches=2,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), callbacks=[PipelineCallback(mode="worker")])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    loss = trainer.callback_metrics.get("train_loss")
    assert loss is not None and torch.isfinite(loss)


@pytest.mark.cuda
def test_time_sampling_times_the_gpu_sampler_alone(half_shared):
    data, handles, _ = half_shared
    builder = BatchBuilder(handles, [5, 3], sampler_placement="gpu", gather="zerocopy")
    try:
        ms = time_sampling(builder, BatchPlan(data.train_idx, 64, seed=2), batches=8, warmup=2)
        assert isinstance(ms, float) and 0 < ms < 1000
    finally:
        builder.close()


@pytest.mark.cuda
def test_the_pcie_bandwidth_is_measured_once_per_process():
    import time

    first = h2d_bandwidth(0)
    assert first is not None and 1.0 < first < 1000.0  # GB/s of a contiguous pinned copy
    t0 = time.perf_counter()
    assert h2d_bandwidth(torch.device("cuda", 0)) == first
    assert time.perf_counter() - t0 < 0.01  # cached
