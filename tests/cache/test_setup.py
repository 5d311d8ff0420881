"""RankCache on one CPU rank with a stand-in DataModule: the options checked together, nothing done without a budget,
the decision made from the host memory (no GPU: nothing placed), a shard retired and freed at the next attach."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.cache.setup import CacheOptions, RankCache, RankPlace
from lightning_zerocopy.graph.schema import EDGE, NODE

CPU_RANK = RankPlace(rank=0, world_size=1, node_rank=0, local_rank=0, device=torch.device("cpu"))


def _datamodule(num_nodes: int = 64, dim: int = 4, hot_rows: int = 0) -> SimpleNamespace:
    features = torch.randn(num_nodes, dim, generator=torch.Generator().manual_seed(0))
    indices = torch.randint(0, num_nodes, (8 * num_nodes,), generator=torch.Generator().manual_seed(1))
    host = SimpleNamespace(tables={NODE: SimpleNamespace(data=features)}, num_nodes={NODE: num_nodes},
                           graphs={EDGE: SimpleNamespace(indices=indices)})  # fmt: skip
    set_caches: list = []
    return SimpleNamespace(hot_rows=hot_rows, uses_zerocopy_gather=False, resources=SimpleNamespace(host=host),
                           set_feature_cache=set_caches.append, set_caches=set_caches)  # fmt: skip


def _never(*args):
    raise AssertionError("not called on a CPU rank with the degree ranking")


def test_options_name_the_strategy_argument() -> None:
    with pytest.raises(ValueError, match="cache_policy"):
        CacheOptions.parse(cache_policy="everywhere")
    with pytest.raises(ValueError, match="presample_batches"):
        CacheOptions.parse(presample_batches=1)
    with pytest.raises(ValueError, match="peer_access must be a square"):
        CacheOptions.parse(peer_access=[[True, False]])
    options = CacheOptions.parse("1KiB", "presample", "clique", 4, [[1, 0], [0, 1]])
    assert (options.budget.amount, options.ranking, options.policy) == (1024, "presample", "clique")
    assert options.peer_access == [[True, False], [False, True]]


def test_without_a_budget_nothing_is_decided() -> None:
    cache = RankCache(CacheOptions.parse(0))
    dm = _datamodule(hot_rows=5)  # hot_rows would conflict with a budget; with none it is fine
    assert cache.attach(dm, CPU_RANK, _never, _never, _never) is None
    assert cache.decision is None and cache.counts() is None and cache.counts_per_type() is None
    assert dm.set_caches == []


def test_a_cpu_rank_decides_from_the_host_memory_and_places_nothing() -> None:
    with pytest.raises(ValueError, match="hot_rows=5 and the strategy's cache_budget"):
        RankCache(CacheOptions.parse("128B")).attach(_datamodule(hot_rows=5), CPU_RANK, _never, _never, _never)
    with pytest.raises(ValueError, match="share of free GPU memory"):
        RankCache(CacheOptions.parse("10%")).attach(_datamodule(), CPU_RANK, _never, _never, _never)
    cache = RankCache(CacheOptions.parse("384B"))  # the 64-row table's lookup (256 B) and 8 rows of 16 bytes
    dm = _datamodule()
    assert cache.attach(dm, CPU_RANK, _never, _never, _never) is None  # decided, but no GPU to place it on
    decision = cache.decision
    assert decision is not None and decision.rows_per_type == {NODE: 8} and decision.bytes_per_gpu == 384
    assert decision.layout.policy == "replicate" and decision.row_bytes == {NODE: 16} and dm.set_caches == []
    assert cache.counts() is None and cache.counts_per_type() == {NODE: None}  # no cache opened here


def test_a_retired_shard_is_kept_until_the_next_attach() -> None:
    cache = RankCache(CacheOptions.parse(0))
    shard = torch.zeros(3)
    cache._shards = [shard]  # what _place keeps on a GPU rank
    cache.retire()
    assert cache._shards == [] and cache._retired == [shard]
    cache.attach(_datamodule(), CPU_RANK, _never, _never, _never)  # one rank: no barrier to wait for
    assert cache._retired == []


def test_a_budget_the_row_lookup_fills_places_no_cache() -> None:
    # a GPU rank (stand-in: nothing below touches CUDA when nothing is cached): the 64-row table's lookup is 256 B,
    # so a 255 B budget holds no row; no shard is filled and no cache (with its lookup) is set on the DataModule
    gpu_rank = RankPlace(rank=0, world_size=1, node_rank=0, local_rank=0, device=torch.device("cuda", 0))
    cache = RankCache(CacheOptions.parse("255B"))
    dm = _datamodule()
    dm.uses_zerocopy_gather = True
    assert cache.attach(dm, gpu_rank, lambda: 10**9, _never, _never) is None
    decision = cache.decision
    assert decision is not None and decision.rows_per_type == {NODE: 0} and decision.bytes_per_gpu == 0
    assert "nothing cached: the row lookup (256 B per GPU)" in decision.summary() and dm.set_caches == []
