"""The segmented cache as the DataModule's cache provider: a SegmentedCacheSpec carried by BatchBuilders, opened by
DeviceResources in the trainer process and, over CUDA IPC, in a spawned process (what a pipeline worker does)."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import random_node_data
import torch.multiprocessing as mp

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.cache.provider import FeatureCacheSpec as CacheProvider
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.data.resources import DeviceResources
from lightning_zerocopy.datasets.base import NodeData
from lightning_zerocopy.graph.schema import NODE
from lightning_zerocopy.cache import CachePlan, SegmentedCacheSpec, SegmentedFeatureCache, ShardHandle, fill_shard

NUM_NODES, NUM_EDGES, FEATURES = 600, 5000, 16


def _graph() -> NodeData:
    return random_node_data(NUM_NODES, NUM_EDGES, FEATURES, seed=21, train=400, val=100)


def _fake_spec() -> SegmentedCacheSpec:
    plan = CachePlan.from_ranking(torch.arange(NUM_NODES), NUM_NODES, 2, num_rows=100)
    handles = tuple(
        ShardHandle(shard_index=s, num_rows=plan.shard_sizes[s], dim=FEATURES, dtype=torch.float32, device_index=0,
                    device_uuid="GPU-x", owner_pid=1, key=f"k{s}", plan_digest=plan.digest)  # fmt: skip
        for s in range(2)
    )
    return SegmentedCacheSpec(plan, handles, policy="clique")


def test_spec_is_a_cache_provider_hashable_and_picklable() -> None:
    spec = _fake_spec()
    assert isinstance(spec, CacheProvider)
    assert hash(spec) == hash(_fake_spec()) and spec == _fake_spec()
    assert pickle.loads(pickle.dumps(spec)) == spec


@pytest.fixture()
def node_data() -> NodeData:
    """The graph ``shared`` (``tests/conftest.py``) shares."""
    return _graph()


def _spec_on_gpu0(table: torch.Tensor, num_shards: int):
    ranking = torch.randperm(NUM_NODES, generator=torch.Generator().manual_seed(num_shards))
    plan = CachePlan.from_ranking(ranking, NUM_NODES, num_shards, num_rows=250)
    shards = [fill_shard(plan, s, table, torch.device("cuda", 0)) for s in range(num_shards)]
    return [t for t, _ in shards], SegmentedCacheSpec(plan, tuple(h for _, h in shards), policy="clique")


@pytest.mark.cuda
@pytest.mark.parametrize("num_shards", [1, 3])
def test_builders_gather_through_the_cache(shared, num_shards) -> None:
    data, handles = shared
    resources = DeviceResources(handles, 0)
    try:
        shards, spec = _spec_on_gpu0(resources.host.features.data, num_shards)
        plain = BatchBuilder(handles, [5, 3], gather="zerocopy", gather_mode="direct").open(resources)
        cached = BatchBuilder(handles, [5, 3], gather="zerocopy", gather_mode="sorted", cache=spec).open(resources)
        cache = cached._gpu.features[NODE]
        assert isinstance(cache, SegmentedFeatureCache) and cache.read_order == "sorted"
        plan = BatchPlan(data.train_idx, 64, shuffle=True, seed=3)
        rows = 0
        for step in range(3):
            a, b = plain.build_batch(plan.item(0, step)), cached.build_batch(plan.item(0, step))
            assert torch.equal(a.x, b.x) and torch.equal(b.x.cpu(), data.x[b.n_id.cpu()])
            rows += b.n_id.numel()
        counts = cache.counts()
        assert counts.total == rows and counts.local > 0 and counts.peer == 0
    finally:
        resources.close()
    assert cache.closed
    del shards


def _build_in_child(builder: BatchBuilder, item, queue) -> None:
    try:
        builder.open()
        batch = builder.build_batch(item)
        counts = builder._gpu.features[NODE].counts()
        # numpy pickles by value: a shared tensor would need this process alive until the parent unpickles it
        queue.put(("ok", batch.x.cpu().numpy(), batch.n_id.cpu().numpy(), tuple(counts)))
        builder.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(exc), None, None))


@pytest.mark.cuda
def test_a_spawned_builder_opens_the_shards_over_ipc(shared) -> None:
    data, handles = shared
    resources = DeviceResources(handles, 0)
    try:
        shards, spec = _spec_on_gpu0(resources.host.features.data, 2)
        builder = BatchBuilder(handles, [5, 3], gather="zerocopy", cache=spec, device=0)
        item = BatchPlan(data.train_idx, 64, shuffle=True, seed=4).item(0, 1)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_build_in_child, args=(builder, item, queue))
        proc.start()
        try:
            status, x, n_id, counts = queue.get(timeout=120)
        finally:
            proc.join(timeout=60)  # the shards stay alive in this process until the child is done
        assert status == "ok", x
        x, n_id = torch.from_numpy(x), torch.from_numpy(n_id)
        assert torch.equal(x, data.x[n_id]) and sum(counts) == n_id.numel() and counts[0] > 0
    finally:
        resources.close()
    del shards
