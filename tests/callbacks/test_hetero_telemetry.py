"""DataTelemetry over heterogeneous batches: edges and feature bytes summed over every type, sampled nodes per type,
host bytes per featured type (every row from host without a cache; with a cache over typed rows, each type's rows
the cache did not serve times that type's row bytes, from the trainer's counters and a pipeline worker's report)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from helpers.hetero import EDGE_TYPES, TinyHeteroDataset, TinyHeteroSAGE
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.callbacks import DataTelemetry


class _Sizes(Callback):
    """Each training batch's sizes, as the test computes them from the batch itself."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        sizes = {f"rows_{t}": float(batch[t].n_id.numel()) for t in batch.node_types}
        sizes["edges"] = float(sum(batch[et].edge_index.size(1) for et in EDGE_TYPES))
        sizes["x_bytes"] = float(sum(batch[t].x.numel() * 4 for t in ("paper", "institution")))
        for t in ("paper", "institution"):  # float32 host tables of 8 and 4 features
            sizes[f"host_bytes_{t}"] = float(batch[t].n_id.numel() * batch[t].x.shape[1] * 4)
        self.seen.append(sizes)


def test_a_short_fit_counts_every_type(tmp_path) -> None:
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=4, num_threads=1)
    torch.manual_seed(0)
    model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
    telemetry, sizes = DataTelemetry(prog_bar=True), _Sizes()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, log_every_n_steps=2,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), callbacks=[telemetry, sizes])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 5  # 20 training papers, 4 a batch
    history = telemetry.history
    assert len(history) == 4  # the first step has no interval before it
    for figures, batch in zip(history, sizes.seen[1:]):  # a step's figures are those of the batch it starts
        for node_type in ("paper", "author", "institution"):
            assert figures[f"data/rows_{node_type}"] == batch[f"rows_{node_type}"]
        seconds = figures["data/step_ms"] / 1e3
        assert figures["data/seps"] * seconds == pytest.approx(batch["edges"], rel=1e-9) and batch["edges"] > 0
        assert figures["data/gather_GBps"] * seconds * 1e9 == pytest.approx(batch["x_bytes"], rel=1e-9)
    epoch_rows = trainer.callback_metrics["data/rows_author_epoch"]
    assert float(epoch_rows) == pytest.approx(sum(b["rows_author"] for b in sizes.seen[1:]) / 4)


def test_without_a_cache_every_row_of_a_featured_type_is_read_from_host(tmp_path) -> None:
    """``data/host_bytes_<type>``: a step's rows of that type times the host table's row bytes (32 B for paper's 8
    float32 features, 16 B for institution's 4), ``data/host_bytes`` their sum; a featureless type reads nothing."""
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=4, num_threads=1)
    torch.manual_seed(0)
    model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
    telemetry, sizes = DataTelemetry(prog_bar=False), _Sizes()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, log_every_n_steps=2,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), callbacks=[telemetry, sizes])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert dm.feature_cache is None
    history = telemetry.history
    assert len(history) == 4
    for figures, batch in zip(history, sizes.seen[1:]):
        assert figures["data/rows_paper"] * 32 == figures["data/host_bytes_paper"] == batch["host_bytes_paper"] > 0
        assert figures["data/rows_institution"] * 16 == figures["data/host_bytes_institution"]
        assert figures["data/host_bytes_institution"] == batch["host_bytes_institution"]
        assert figures["data/host_bytes"] == batch["host_bytes_paper"] + batch["host_bytes_institution"]
        assert "data/host_bytes_author" not in figures  # no features: nothing read
    epoch = float(trainer.callback_metrics["data/host_bytes_paper_epoch"])
    assert epoch == pytest.approx(sum(b["host_bytes_paper"] for b in sizes.seen[1:]) / 4)


def test_feature_row_bytes_are_the_host_tables_and_need_setup() -> None:
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=4, num_threads=1,
                                  feature_dtype="bfloat16")  # fmt: skip
    with pytest.raises(RuntimeError, match="call setup"):
        dm.feature_row_bytes
    dm.setup("fit")
    try:
        assert dm.feature_row_bytes == {"paper": 8 * 2, "institution": 4 * 2}  # the host dtype's bytes
    finally:
        dm.teardown("fit")


# ---- a cache over typed rows: its counters per featured type (the strategy and a worker stand in here; the GPU
# run of the real cache is tests/cache/test_typed_feature_cache_cuda.py) -------------------------------------------


class _LoggingModule:
    """Records ``log`` calls by name."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}
        self.device = torch.device("cpu")

    def log(self, name: str, value, **kwargs) -> None:
        self.logged[name] = float(value)


def _typed_strategy(readings):
    """A strategy with a cache over typed rows: paper rows of 32 B, institution rows of 128 B (each type's plan has
    its own digest), counters read from ``readings`` (one dict per read)."""
    decision = SimpleNamespace(plans={"paper": SimpleNamespace(digest="d-paper"),
                                      "institution": SimpleNamespace(digest="d-inst")},
                               row_bytes={"paper": 32, "institution": 128})  # fmt: skip
    return SimpleNamespace(cache_decision=decision, cache_counts_per_type=lambda: next(readings),
                           cache_counts=lambda: pytest.fail("the counters are read per type"))  # fmt: skip


def test_a_typed_cache_reports_each_types_hit_rate_and_host_bytes_at_its_row_bytes() -> None:
    from lightning_zerocopy.cache.segmented import CacheCounts

    readings = iter([
        {"paper": CacheCounts(10, 0, 4), "institution": CacheCounts(1, 0, 1)},
        {"paper": CacheCounts(70, 10, 24), "institution": CacheCounts(3, 0, 9)},
    ])  # fmt: skip
    module, telemetry = _LoggingModule(), DataTelemetry(prog_bar=False)
    trainer = SimpleNamespace(strategy=_typed_strategy(readings))
    telemetry.on_train_epoch_start(trainer, module)
    telemetry.on_train_epoch_end(trainer, module)
    logged = module.logged
    # the epoch: paper 60 local + 10 peer + 20 host, institution 2 local + 8 host
    assert logged["cache/rows_paper"] == 90 and logged["cache/host_rows_paper"] == 20
    assert logged["cache/hit_rate_paper"] == pytest.approx(70 / 90)
    assert logged["cache/rows_institution"] == 10 and logged["cache/hit_rate_institution"] == pytest.approx(0.2)
    assert logged["cache/host_bytes_paper"] == 20 * 32 and logged["cache/host_bytes_institution"] == 8 * 128
    assert logged["cache/host_bytes"] == 20 * 32 + 8 * 128  # not 0: each type's rows at its own width
    assert (logged["cache/local_rows"], logged["cache/peer_rows"], logged["cache/host_rows"]) == (62, 10, 28)
    assert logged["cache/hit_rate"] == pytest.approx(72 / 100) and logged["cache/host_read_GBps"] > 0
    assert telemetry.cache_history == [logged]


def test_a_workers_typed_counters_are_mapped_to_types_by_plan_and_added_once() -> None:
    from lightning_zerocopy.callbacks import PipelineCallback
    from lightning_zerocopy.pipeline.client import CacheReport, PipelineStats

    nothing = {"paper": None, "institution": None}  # the trainer process opened no cache: a worker gathers
    readings = iter([nothing, nothing])
    pipeline = PipelineCallback(mode="worker")
    pipeline.client = SimpleNamespace(stats=PipelineStats())
    module, telemetry = _LoggingModule(), DataTelemetry(prog_bar=False)
    trainer = SimpleNamespace(strategy=_typed_strategy(readings), callbacks=[pipeline, telemetry])
    telemetry.on_train_epoch_start(trainer, module)
    # the worker's report: totals with the host rows' mean width, and exact counts per plan
    per_plan = (("d-inst", 5, 0, 3, 128), ("d-paper", 40, 0, 12, 32))
    pipeline.client.stats.cache = CacheReport(45, 0, 15, (3 * 128 + 12 * 32) // 15, per_plan)
    telemetry.on_train_epoch_end(trainer, module)
    logged = module.logged
    assert logged["cache/host_bytes_paper"] == 12 * 32 and logged["cache/host_bytes_institution"] == 3 * 128
    assert logged["cache/host_bytes"] == 3 * 128 + 12 * 32  # exact, not host rows x their mean width
    assert logged["cache/hit_rate_paper"] == pytest.approx(40 / 52) and logged["cache/rows_institution"] == 8
    assert (logged["cache/local_rows"], logged["cache/host_rows"]) == (45, 15)
