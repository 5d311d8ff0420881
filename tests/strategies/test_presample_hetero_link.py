"""``cache_ranking: presample`` over a heterogeneous link DataModule: the heterogeneous builder samples the link
batches of a one-rank plan on ``PRESAMPLE_STREAM`` (seeds: each supervision edge's endpoints per endpoint type) and
counts every featured type's ``n_id``; the counts do not depend on the world size, and the cache over typed rows is
decided from them (CPU: decided, nothing placed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.hetero_link import ITEM, USER, small_graph
from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.cache.setup import CacheOptions, RankCache, RankPlace
from lightning_zerocopy.data.hetero_batch import HeteroBatchBuilder
from lightning_zerocopy.strategies.presample import PRESAMPLE_STREAM, presample_halves

ROWS = {USER: 300, ITEM: 150}  # small_graph's, both featured


@pytest.fixture(scope="module")
def dm(tmp_path_factory: pytest.TempPathFactory):
    cache = str(tmp_path_factory.mktemp("hetero-link-presample"))
    module = ZeroCopyHeteroLinkDataModule(small_graph(cache), num_neighbors=[3, 2], batch_size=16, num_threads=1)
    module.setup("fit")
    yield module
    module.teardown("fit")


def test_link_batches_are_presampled_per_endpoint_type_as_the_builder_samples_them(dm) -> None:
    halves = presample_halves(dm, 6, 0, 1, ROWS)
    assert set(halves) == set(ROWS) and all(halves[t].shape == (2, n) for t, n in ROWS.items())
    # the reference: the same plan's items through a builder of its own, n_id counted per type and half
    plan = dm.plan("train").one_rank_plan(PRESAMPLE_STREAM)
    builder = HeteroBatchBuilder(dm.handles, dm.fanouts, replace=dm.replace, num_threads=1).open(dm.resources,
                                                                                             place=False)  # fmt: skip
    expected = {t: torch.zeros(2, n, dtype=torch.int64) for t, n in ROWS.items()}
    pos = dm.link_splits["train"].pos_edge_index
    try:
        for k in range(6):
            item = plan.item(k // len(plan), k % len(plan))
            n_id = builder.sample_batch(item).sample.n_id
            for t in ROWS:
                expected[t][k % 2] += torch.bincount(n_id[t].to(torch.int64), minlength=ROWS[t])
            # the seeds are the supervision edges' endpoints, each in its own type's id space
            src, dst = pos[:, item.input_id]
            assert bool(halves[USER][k % 2][src].gt(0).all()) and bool(halves[ITEM][k % 2][dst].gt(0).all())
    finally:
        builder.close()
    assert all(torch.equal(halves[t], expected[t]) for t in ROWS)
    assert all(int(halves[t].sum()) > 0 for t in ROWS)


def test_the_counts_summed_over_ranks_do_not_depend_on_the_world_size(dm) -> None:
    one = presample_halves(dm, 7, 0, 1, ROWS)
    three = [presample_halves(dm, 7, r, 3, ROWS) for r in range(3)]
    assert all(torch.equal(one[t], sum(part[t] for part in three)) for t in ROWS)
    assert all(torch.equal(one[t], presample_halves(dm, 7, 0, 1, ROWS)[t]) for t in ROWS)  # deterministic


def test_the_cache_over_typed_rows_is_ranked_from_the_presampled_link_batches(dm) -> None:
    cache = RankCache(CacheOptions.parse("2KiB", "presample", "auto", 8))
    place = RankPlace(0, 1, 0, 0, torch.device("cpu"))
    asked = []

    def presample(num_rows):
        asked.append(dict(num_rows))
        return presample_halves(dm, 8, 0, 1, num_rows)

    assert cache.attach(dm, place, lambda: 0, presample, lambda name: None) is None  # CPU: decided, nothing placed
    decision = cache.decision
    assert asked == [ROWS] and decision.prior_weight is not None  # ranked by the presampled counts
    assert set(decision.plans) == set(ROWS) and sum(decision.rows_per_type.values()) > 0
    assert "held out; presampled counts" in decision.summary() and decision.bytes_per_gpu <= 2048
