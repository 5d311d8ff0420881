"""DeviceResources: one owner per process for what the data path places; cache specs travel with the builders."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import random_node_data

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.cache.provider import CacheContext, FeatureCacheSpec, HotRowsCache, plain_feature_table
from lightning_zerocopy.data.host.share import share_node_data
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.data.resources import DeviceResources, ResourceScope
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.datasets.base import NodeData
from lightning_zerocopy.graph.schema import NODE

NUM_NODES, NUM_EDGES, FEATURES = 500, 4000, 8


def _graph() -> NodeData:
    return random_node_data(NUM_NODES, NUM_EDGES, FEATURES, seed=5, train=300, val=100)


@dataclass(frozen=True)
class EvenRowsCache:
    """A provider that keeps the even rows on the GPU (what a sharded cache of rank 0 of 2 might do)."""

    stride: int = 2

    def open(self, context: CacheContext):
        rows = torch.arange(0, context.num_nodes, self.stride)
        return plain_feature_table(context, hot_rows=rows)


@pytest.fixture()
def node_data() -> NodeData:
    """The graph ``shared`` (``tests/conftest.py``) shares."""
    return _graph()


def test_scope_gives_one_resources_per_memory_and_device_and_closes_them(shared) -> None:
    _, handles = shared
    scope = ResourceScope()
    a, b = scope.get(handles, 0), scope.get(handles, 0)
    assert a is b and scope.get(handles, None) is not a
    train = BatchBuilder(handles, [5, 3]).open(a)
    evaluation = BatchBuilder(handles, [-1]).open(a)
    assert train._host is evaluation._host, "one mapping of the host memory"
    scope.close()
    assert a.closed
    with pytest.raises(RuntimeError, match="closed"):
        a.labels()


def test_builder_rejects_resources_of_other_memory(shared) -> None:
    data, handles = shared
    other = share_node_data(data)
    try:
        with pytest.raises(ValueError, match="other host memory"):
            BatchBuilder(handles, [5]).open(DeviceResources(other))
    finally:
        other.unlink()


def test_cache_spec_is_checked_pickled_and_carried_to_every_builder(tmp_path: Path) -> None:
    assert isinstance(EvenRowsCache(), FeatureCacheSpec) and isinstance(HotRowsCache(3), FeatureCacheSpec)
    with pytest.raises(ValueError, match="`rows`"):
        HotRowsCache(0)
    dm = ZeroCopyDataModule(SyntheticGraph(num_nodes=300, avg_degree=4, num_features=8, cache_dir=str(tmp_path)), fanouts=[3])
    assert dm.feature_cache is None
    with pytest.raises(TypeError, match="FeatureCacheSpec"):
        dm.set_feature_cache(object())  # type: ignore[arg-type]
    dm.set_feature_cache(EvenRowsCache())
    hot = ZeroCopyDataModule(SyntheticGraph(num_nodes=300, avg_degree=4, num_features=8, cache_dir=str(tmp_path)), hot_rows=7)
    assert hot.feature_cache == HotRowsCache(7)
    handles = share_node_data(_graph())
    try:
        builder = BatchBuilder(handles, [3], gather="zerocopy", cache=EvenRowsCache())
        clone = pickle.loads(pickle.dumps(builder))
        assert clone.cache == EvenRowsCache() and clone.hot_rows == 0
        assert BatchBuilder(handles, [3], gather="zerocopy", hot_rows=4).cache == HotRowsCache(4)
        with pytest.raises(ValueError, match="not both"):
            BatchBuilder(handles, [3], gather="zerocopy", hot_rows=4, cache=EvenRowsCache())
        with pytest.raises(ValueError, match="gather='zerocopy'"):
            BatchBuilder(handles, [3], cache=EvenRowsCache())
    finally:
        handles.unlink()


def test_datamodule_owns_the_resources_from_setup_to_teardown_and_on_exception(tmp_path: Path) -> None:
    dm = ZeroCopyDataModule(SyntheticGraph(num_nodes=300, avg_degree=4, num_features=8, cache_dir=str(tmp_path)), fanouts=[3])
    assert dm.resources is None
    dm.setup("fit")
    resources = dm.resources
    assert resources is not None and dm.train_dataloader().builder.resources is resources
    dm.teardown("fit")
    assert resources.closed and dm.resources is None
    dm.setup("fit")
    again = dm.resources
    assert again is not resources and not again.closed
    dm.on_exception(RuntimeError("boom"))
    assert again.closed and dm.resources is None


# ------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
def test_a_custom_cache_spec_serves_its_rows_and_gives_the_same_batches(shared) -> None:
    data, handles = shared
    plan = BatchPlan(data.train_idx, 64, shuffle=True, seed=3)
    resources = DeviceResources(handles)
    try:
        plain = BatchBuilder(handles, [5, 3], gather="zerocopy", gather_mode="direct").open(resources)
        even = BatchBuilder(handles, [5, 3], gather="zerocopy", gather_mode="direct", cache=EvenRowsCache()).open(resources)
        assert even._gpu.features[NODE] is not plain._gpu.features[NODE]
        assert even._gpu.features[NODE].num_hot_rows == (NUM_NODES + 1) // 2
        item = plan.item(0, 0)
        a, b = plain.build_batch(item), even.build_batch(item)
        assert torch.equal(a.x, b.x) and torch.equal(b.x.cpu(), data.x[b.n_id.cpu()])
        same = BatchBuilder(handles, [-1], gather="zerocopy", gather_mode="direct", cache=EvenRowsCache()).open(resources)
        assert same._gpu.features[NODE] is even._gpu.features[NODE], "one table per (spec, mode) in one resources"
    finally:
        resources.close()
    assert resources.closed and not resources._registrations


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["gpu", "uva"])
def test_topology_is_placed_once_and_released_on_close(shared, placement) -> None:
    _, handles = shared
    resources = DeviceResources(handles)
    placed = resources.topology(None, placement)
    assert resources.topology(None, placement) is placed
    assert placed.indptr.is_cuda and placed.indices.is_cuda == (placement == "gpu")
    if placement == "uva":
        assert placed.registrations and placed.indices.is_pinned()
    resources.close()
    assert not placed.registrations


def test_resources_import_without_lightning_or_pyg() -> None:
    """A pipeline worker opens DeviceResources; it need not import the DataModule's stack for that."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, lightning_zerocopy.data.resources; "
        "bad = [m for m in ('pytorch_lightning', 'torch_geometric') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
