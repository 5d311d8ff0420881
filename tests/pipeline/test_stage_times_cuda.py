"""The producer's stage split on a GPU (``@pytest.mark.cuda``): CUDA-event times read without a new sync, the gather's
bytes in the stored dtype and its PCIe bound, for the in-process and worker producers, with and without lookahead,
and for a hybrid source; DataTelemetry logs them, the bound included."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.stage_bounds import h2d_bandwidth
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.source import PlanSource

pytestmark = pytest.mark.cuda


def _datamodule(root: Path, **kwargs) -> ZeroCopyDataModule:
    dataset = SyntheticGraph(num_nodes=20000, avg_degree=10, num_features=64, num_classes=4, cache_dir=str(root))
    kwargs.setdefault("sampler_placement", "gpu")
    kwargs.setdefault("gather", "zerocopy")
    return ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=256, **kwargs)


@pytest.mark.parametrize(
    "mode, lookahead, placement, dtype",
    [("in_process", True, "gpu", None), ("in_process", False, "gpu", "bfloat16"), ("worker", True, "gpu", "float16"),
     ("in_process", True, "hybrid", None)],
)  # fmt: skip
def test_gpu_stages_are_event_times_with_the_gathers_bound(tmp_path, monkeypatch, mode, lookahead, placement, dtype):
    dm = _datamodule(tmp_path, sampler_placement=placement, feature_dtype=dtype)
    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # names stay until the producer opened them
    dm.setup("fit")
    client = start_pipeline(mode, depth=2, device="cuda:0", timeout=120, lookahead=lookahead)
    try:
        client.register("train", PlanSource(dm.plan("train"), dm.builder("train")))
        row_bytes = dm.resources.host.features.row_bytes  # the stored dtype's
        for step, batch in enumerate(client.iterate("train", 0, 0, 8)):
            stages = client.stats.last_stages
            assert stages is not None and stages.gpu_times
            assert stages.gather_bytes == batch.n_id.numel() * row_bytes
            assert stages.gather_s > 0 and stages.sample_s > 0 and stages.assemble_s >= 0 and stages.handover_s >= 0
            assert stages.gather_bound_s is not None and 0 < stages.gather_bound_s
            assert batch.x.dtype == torch.float32
        totals = client.stats.stages
        assert totals.batches == 8 and totals.gather_GBps is not None
        assert totals.h2d_GBps == pytest.approx(h2d_bandwidth(0), rel=1e-6) if mode == "in_process" else totals.h2d_GBps > 1
    finally:
        client.close()
        unlink(dm.handles)
        dm.teardown("fit")


def test_telemetry_logs_the_gpu_split_and_the_bound(tmp_path):
    pl.seed_everything(0)
    dm = _datamodule(tmp_path, feature_dtype="bfloat16")
    telemetry = DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, limit_train_batches=12, limit_val_batches=2,
                         log_every_n_steps=4, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[PipelineCallback(mode="worker"), telemetry])  # fmt: skip
    trainer.fit(GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=32, dropout=0.0), datamodule=dm)
    metrics = trainer.callback_metrics
    for key in ("build_sample_ms", "build_gather_ms", "build_assemble_ms", "build_handover_ms", "gather_build_GBps",
                "gather_bound_ms"):  # fmt: skip
        assert f"data/{key}_epoch" in metrics, key
    assert 0 < float(metrics["data/gather_bound_ms_epoch"]) < float(metrics["data/build_ms_epoch"]) * 10
