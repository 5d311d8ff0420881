"""benchmarks.parts.shape_recurrence: the LRU model's exact hits on hand-made row counts, the host-µs arithmetic, the
GEMM row counts of a batch, that its batches are the DataModule's training batches, and the CLI's JSON (tiny graph,
CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.parts.shape_recurrence import (
    AVG_DEGREE,
    BATCH_SIZE,
    CLASSES,
    FANOUTS,
    FEATURES,
    HIT_US,
    MISS_US,
    CacheOutcome,
    LRUCache,
    gemm_row_counts,
    main,
    round_up,
    sample_hop_counts,
    simulate_lru,
)

TINY = 4000  # 2,400 training nodes: two batches of 1,024 an epoch


def test_lru_hits_and_evicts_least_recent_first() -> None:
    cache = LRUCache(2)
    assert [cache.access(k) for k in (1, 2, 1, 3, 2, 1)] == [False, False, True, False, False, False]
    assert len(cache) == 2
    assert [LRUCache(0).access(k) for k in (1, 1)] == [False, False]


def test_simulated_hits_count_every_key_of_a_row_count_and_only_the_measured_steps() -> None:
    steps = [[1], [2], [1], [3], [2], [1]]
    assert simulate_lru(steps, capacity=2, keys_per_rowcount=1) == CacheOutcome(hits=1, lookups=6, steps=6)
    assert simulate_lru(steps, capacity=2, keys_per_rowcount=1, measure_from=3) == CacheOutcome(0, 3, 3)
    # two keys per row count, room for two row counts: 5 hits twice, 6 evicted by 7
    assert simulate_lru([[5], [6], [5], [7], [5]], capacity=4, keys_per_rowcount=2) == CacheOutcome(4, 10, 5)
    # room for one and a half row counts: 6's second key evicts 5's first, and 5 then evicts itself key by key
    assert simulate_lru([[5], [6], [5]], capacity=3, keys_per_rowcount=2) == CacheOutcome(0, 6, 3)
    assert simulate_lru([[5, 6], [5, 6]], capacity=3, keys_per_rowcount=2, measure_from=1).hits == 0
    assert simulate_lru([[5, 6], [5, 6]], capacity=4, keys_per_rowcount=2, measure_from=1) == CacheOutcome(4, 4, 1)


def test_host_us_per_step_prices_hits_and_misses_per_call() -> None:
    outcome = CacheOutcome(hits=6, lookups=18, steps=1)  # one step: 6 hits, 12 misses
    assert outcome.hit_rate == pytest.approx(1 / 3)
    assert outcome.host_us_per_step(6, 6) == pytest.approx(6 * HIT_US + 12 * MISS_US)
    assert outcome.host_us_per_step(3, 6) == pytest.approx(2 * (6 * HIT_US + 12 * MISS_US))
    assert CacheOutcome(0, 0, 0).host_us_per_step(6, 6) == 0.0


def test_a_batch_s_gemm_row_counts_are_its_prefix_sums_from_two_hops_on() -> None:
    nodes = [1024, 10000, 70000, 200000]
    assert gemm_row_counts(nodes) == [11024, 81024, 281024]
    assert gemm_row_counts(nodes, bucket=256) == [11264, 81152, 281088]
    assert round_up(256, 256) == 256 and round_up(257, 64) == 320 and round_up(7, 1) == 7
    assert gemm_row_counts([4, 0, 0, 3]) == [4, 7]  # a repeated row count is one row count of the step


def test_the_graph_and_sampling_are_the_scaling_benchmark_s_heavy_model() -> None:
    import argparse

    from benchmarks.scaling.__main__ import MODELS, synthetic_kwargs

    ns = argparse.Namespace(num_nodes=TINY, avg_degree=16, features=128, cache_dir=None, device="cpu")
    kwargs = synthetic_kwargs(ns)
    assert (kwargs["avg_degree"], kwargs["num_features"], kwargs["num_classes"]) == (AVG_DEGREE, FEATURES, CLASSES)
    assert list(FANOUTS) == MODELS["heavy"][0] and BATCH_SIZE == 1024


def test_the_batches_are_the_datamodule_s_training_batches(tmp_path: Path) -> None:
    from lightning_zerocopy import ZeroCopyDataModule
    from lightning_zerocopy.datasets import SyntheticGraph

    run = sample_hop_counts(TINY, batches=4, cache_dir=str(tmp_path))
    assert run.steps_per_epoch == 2 and run.num_nodes == TINY and len(run.nodes) == 4
    dataset = SyntheticGraph(num_nodes=TINY, avg_degree=AVG_DEGREE, num_features=FEATURES, num_classes=CLASSES,
                             cache_dir=str(tmp_path))  # fmt: skip
    dm = ZeroCopyDataModule(dataset, fanouts=list(FANOUTS), batch_size=BATCH_SIZE, sampler_placement="cpu",
                            gather="cpu", drop_last=True, seed=0)  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        seen = []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            seen += [list(batch.num_sampled_nodes) for batch in loader]
    finally:
        dm.teardown("fit")
    assert seen == run.nodes


def test_the_cli_writes_its_figures_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shape_recurrence.json"
    main(["--num-nodes", str(TINY), "--batches", "6", "--capacities", "6,1024", "--cache-dir", str(tmp_path / "data"),
          "--out", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["run"]["batches"] == 6 and len(report["nodes"]) == 6
    assert all(n[0] == BATCH_SIZE and len(n) == len(FANOUTS) + 1 for n in report["nodes"])
    assert set(report["distinct"]) == {"exact", "pad64", "pad256"}
    assert set(report["distinct"]["exact"]) == {"p1", "p2", "p3", "p4", "gemm"}
    assert report["distinct"]["exact"]["p1"] == 1
    for rows in report["cache"].values():
        assert [r["capacity"] for r in rows] == [6, 1024]
        for r in rows:  # the last 3 of 6 steps measured, at most 3 row counts of 6 keys each
            assert 0 < r["lookups"] <= 3 * 3 * 6 and r["lookups"] % 6 == 0 and 0.0 <= r["hit_rate"] <= 1.0
            per_step = r["lookups"] / 3
            assert HIT_US * per_step - 1e-6 <= r["host_us_per_step"] <= MISS_US * per_step + 1e-6
        assert rows[0]["hits"] <= rows[1]["hits"]
    assert "LRU over the last half" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--capacities", "1024,lots"])
    assert "--capacities must be comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--batches", "1"])
