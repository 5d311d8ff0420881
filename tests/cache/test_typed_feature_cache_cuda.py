"""The GPU cache over typed rows (CUDA-marked; not run on a machine without a GPU): a ``TypedFeatureCache`` handed to a
heterogeneous DataModule gathers every featured type's rows bitwise as the host tables hold them, each type through
its own ``SegmentedFeatureCache`` (hot rows from the GPU shard, the rest from host memory); ``ZeroCopyDDPStrategy``
with a ``cache_budget`` decides it over every featured type on one GPU, trains, and its counters see hits."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from helpers.hetero import TinyHeteroDataset
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.cache import CachePlan, SegmentedCacheSpec, SegmentedFeatureCache, fill_shard
from lightning_zerocopy.cache.decide import CacheDecision
from lightning_zerocopy.cache.provider import TypedFeatureCache
from lightning_zerocopy.datasets import SyntheticHeteroGraph
from lightning_zerocopy.models import HeteroNodeClassifier
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy


def _typed_spec(tables: dict[str, torch.Tensor], cached: dict[str, int]) -> tuple[list[torch.Tensor], TypedFeatureCache]:
    """One replicated shard per type on cuda:0 holding the first ``cached[t]`` rows of a seeded permutation."""
    shards, specs = [], []
    for i, (node_type, table) in enumerate(tables.items()):
        order = torch.randperm(table.shape[0], generator=torch.Generator().manual_seed(i))
        plan = CachePlan.from_ranking(order, table.shape[0], 1, num_rows=cached[node_type])
        shard, handle = fill_shard(plan, 0, table, torch.device("cuda", 0))
        shards.append(shard)
        specs.append((node_type, SegmentedCacheSpec(plan, (handle,), policy="replicate")))
    return shards, TypedFeatureCache(tuple(specs))


def _cpu_batch(module, step: int):
    builder = module.builder("train")
    builder.sampler_placement = builder.gpu_sampler_placement = "cpu"
    builder.gather = "cpu"
    try:
        return builder.open(module.resources).build_batch(module.plan("train").item(0, step))
    finally:
        builder.close()


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_a_typed_cache_gathers_every_featured_types_rows_bitwise(placement: str) -> None:
    data = TinyHeteroDataset().load()
    tables = {t: x.contiguous() for t, x in data.x.items()}  # paper and institution; author has no features
    shards, spec = _typed_spec(tables, {"paper": 15, "institution": 3})
    module = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=8, num_threads=1,
                                      sampler_placement=placement, gather="zerocopy")  # fmt: skip
    module.set_feature_cache(spec)  # before setup: every builder carries it
    module.setup("fit")
    try:
        for step in range(3):
            gpu = module.builder("train").open(module.resources).build_batch(module.plan("train").item(0, step))
            cpu = _cpu_batch(module, step)
            for node_type in tables:
                assert gpu[node_type].x.is_cuda
                assert torch.equal(gpu[node_type].x.cpu(), cpu[node_type].x), node_type
        local = 0
        for node_type in tables:
            cache = module.resources.feature_table(node_type, module.gather_mode, spec)
            assert isinstance(cache, SegmentedFeatureCache) and cache.plan == dict(spec.specs)[node_type].plan
            counts = cache.counts()
            assert counts.total > 0  # every featured type's rows went through its own cache
            local += counts.local
        assert local > 0  # some hot rows were read from this GPU's shards
    finally:
        module.teardown("fit")
    del shards


@pytest.mark.cuda
def test_a_cache_of_one_table_is_refused() -> None:
    from lightning_zerocopy.cache import HotRowsCache

    module = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[2], batch_size=4, gather="zerocopy")
    with pytest.raises(ValueError, match="per node type"):
        module.set_feature_cache(HotRowsCache(4))


class _CheckRows(Callback):
    """Every batch's ``x`` of every featured type is bitwise its host table's rows of ``n_id``."""

    def __init__(self) -> None:
        self.checked = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        host = trainer.datamodule.resources.host
        for node_type, table in host.features.items():
            if node_type in batch.node_types and batch[node_type].n_id.numel():
                assert batch[node_type].x.is_cuda
                assert torch.equal(batch[node_type].x.cpu().to(table.data.dtype),
                                   table.data[batch[node_type].n_id.cpu()]), node_type  # fmt: skip
        self.checked += 1

    def on_train_end(self, trainer, pl_module) -> None:  # before teardown closes the builders' caches
        self.counts = trainer.strategy.cache_counts()
        self.per_type = trainer.strategy.cache_counts_per_type()


@pytest.mark.cuda
@pytest.mark.parametrize("ranking", ["degree", "presample"])
@pytest.mark.parametrize("budget", ["16KiB", "1GiB"])
def test_the_strategy_caches_every_featured_type_under_one_budget_on_one_gpu(
    tmp_path: Path, ranking: str, budget: str
) -> None:
    _fit_and_check(tmp_path, ranking, budget)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_a_pipeline_producer_gathers_every_type_through_the_same_cache(tmp_path: Path, mode: str) -> None:
    """A PipelineCallback producer (a worker process opens the trainer's shards over CUDA IPC) builds the same rows."""
    from lightning_zerocopy.callbacks import PipelineCallback

    _fit_and_check(tmp_path, "degree", "16KiB", PipelineCallback(mode=mode), own_counts=mode == "in_process")


def _fit_and_check(tmp_path: Path, ranking: str, budget: str, *callbacks: Callback, own_counts: bool = True) -> None:
    dataset = SyntheticHeteroGraph(num_papers=2000, num_features=16, num_classes=4,
                                   featured_types=("paper", "institution"), cache_dir=str(tmp_path / "data"))  # fmt: skip
    dm = ZeroCopyHeteroDataModule(dataset, num_neighbors=[5, 3], batch_size=64, gather="zerocopy", seed=3)
    strategy = ZeroCopyDDPStrategy(cache_budget=budget, cache_ranking=ranking, cache_policy="auto",
                                   presample_batches=16)  # fmt: skip
    check = _CheckRows()
    trainer = pl.Trainer(accelerator="gpu", devices=1, strategy=strategy, max_epochs=1, limit_train_batches=8,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[check, *callbacks])  # fmt: skip
    model = HeteroNodeClassifier(dm.num_features, dm.num_classes, hidden_channels=16, num_layers=2, dropout=0.0)
    trainer.fit(model, datamodule=dm)
    assert check.checked > 0
    decision = strategy.cache_decision
    assert isinstance(decision, CacheDecision) and set(decision.plans) == {"paper", "institution"}
    assert decision.layout.policy == "replicate" and decision.group == (0,)
    assert decision.bytes_per_gpu <= decision.budget_bytes and sum(decision.rows_per_type.values()) > 0
    if budget == "1GiB":
        assert decision.whole_table  # every row of every featured type fits
    assert check.per_type is not None and set(check.per_type) == {"paper", "institution"}
    if not own_counts:  # a worker process gathered: its caches are not this process's
        return
    assert check.counts is not None and check.counts.local > 0  # hot rows were read from this GPU's shards
    assert check.counts.total == sum(c.total for c in check.per_type.values() if c is not None)
    if budget == "1GiB":
        assert check.counts.host == 0  # the whole tables are on the GPU


@pytest.mark.cuda
@pytest.mark.parametrize("mode", [None, "worker"])
def test_data_telemetry_reports_each_types_rows_and_host_bytes_at_its_row_bytes(tmp_path: Path, mode) -> None:
    """``DataTelemetry``'s epoch figures over a cache over typed rows: per featured type the rows gathered, the hit
    rate and the host bytes (the rows the cache did not serve times that type's row bytes), summed into
    ``cache/host_bytes`` (not 0); in process they equal the strategy's counters, from a worker its per-plan report."""
    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

    telemetry = DataTelemetry(prog_bar=False)
    extra = [telemetry] if mode is None else [telemetry, PipelineCallback(mode=mode)]
    dataset = SyntheticHeteroGraph(num_papers=2000, num_features=16, num_classes=4,
                                   featured_types=("paper", "institution"), cache_dir=str(tmp_path / "data"))  # fmt: skip
    dm = ZeroCopyHeteroDataModule(dataset, num_neighbors=[5, 3], batch_size=64, gather="zerocopy", seed=3)
    strategy = ZeroCopyDDPStrategy(cache_budget="16KiB", cache_ranking="degree", cache_policy="auto")
    check = _CheckRows()
    trainer = pl.Trainer(accelerator="gpu", devices=1, strategy=strategy, max_epochs=1, limit_train_batches=8,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[check, *extra])  # fmt: skip
    model = HeteroNodeClassifier(dm.num_features, dm.num_classes, hidden_channels=16, num_layers=2, dropout=0.0)
    trainer.fit(model, datamodule=dm)
    (figures,) = telemetry.cache_history
    row_bytes = strategy.cache_decision.row_bytes
    types = ("paper", "institution")
    assert all(figures[f"cache/rows_{t}"] > 0 for t in types)
    assert figures["cache/host_bytes"] > 0
    assert figures["cache/host_bytes"] == sum(figures[f"cache/host_bytes_{t}"] for t in types)
    for t in types:
        assert figures[f"cache/host_bytes_{t}"] == figures[f"cache/host_rows_{t}"] * row_bytes[t]
    if mode is None:  # the trainer process gathered: its counters are the figures
        for t in types:
            counts = check.per_type[t]
            assert figures[f"cache/host_rows_{t}"] == counts.host and figures[f"cache/rows_{t}"] == counts.total
