"""DataTelemetry's stage figures: the producer's split of each build, summed like the other figures, logged on log
steps and epoch ends (on the CPU here; ``test_stage_telemetry_cuda`` has the GPU times and the PCIe bound)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.step_figures import StepSums
from lightning_zerocopy.callbacks.telemetry import _stage_figures
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE
from lightning_zerocopy.pipeline.stage_times import BuildStages

STAGE_KEYS = ("data/build_sample_ms", "data/build_gather_ms", "data/build_assemble_ms", "data/build_handover_ms")


def _step(stages: BuildStages) -> dict[str, float]:
    step = {"interval_s": 0.01, "wait_s": 0.0, "stall_s": 0.0, "edges": 100.0, "x_bytes": 1000.0, "build_ms": 5.0}
    step.update(_stage_figures(stages))
    return step


def _figures(*builds: BuildStages) -> dict[str, float]:
    """The figures of one step per build, summed."""
    sums = StepSums()
    for stages in builds:
        sums.add(_step(stages))
    return {name: ratio.value for name, ratio in sums.figures().items()}


def test_step_sums_average_the_stages_and_sum_the_gathers_rate():
    figures = _figures(BuildStages(0.001, 0.002, 0.0005, 0.0001, gather_bytes=4_000_000, gather_bound_s=0.0008),
                       BuildStages(0.003, 0.006, 0.0015, 0.0003, gather_bytes=8_000_000, gather_bound_s=0.0016))
    assert figures["data/build_sample_ms"] == pytest.approx(2.0)
    assert figures["data/build_gather_ms"] == pytest.approx(4.0)
    assert figures["data/build_assemble_ms"] == pytest.approx(1.0)
    assert figures["data/build_handover_ms"] == pytest.approx(0.2)
    assert figures["data/gather_bound_ms"] == pytest.approx(1.2)
    assert figures["data/gather_build_GBps"] == pytest.approx(12e6 / 0.008 * 1e-9)  # bytes over time, not a mean
    assert figures["data/build_ms"] == pytest.approx(5.0)
    assert "stage_gather_bytes" not in str(figures)  # the sums' inputs are not figures


def test_the_samples_host_and_cpu_times_are_averaged_where_measured():
    figures = _figures(BuildStages(0.004, 0.002, 0.0, 0.0, sample_host_s=0.004, sample_cpu_s=0.001),
                       BuildStages(0.006, 0.002, 0.0, 0.0, sample_host_s=0.008, sample_cpu_s=0.003))
    assert figures["data/build_sample_host_ms"] == pytest.approx(6.0)
    assert figures["data/build_sample_cpu_ms"] == pytest.approx(2.0)
    unmeasured = _figures(BuildStages(0.001, 0.002, 0.0, 0.0))
    assert "data/build_sample_host_ms" not in unmeasured and "data/build_sample_cpu_ms" not in unmeasured


def test_no_bound_no_bound_figure():
    figures = StepSums.of(_step(BuildStages(0.001, 0.002, 0.0, 0.0, gather_bytes=10))).figures()
    assert "data/gather_bound_ms" not in figures and "data/gather_build_GBps" in figures


@pytest.mark.parametrize("lookahead", [True, False])
def test_a_pipeline_fit_logs_the_stage_split_on_log_steps_and_at_the_epochs_end(tmp_path: Path, lookahead):
    pl.seed_everything(0)
    dataset = SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=str(tmp_path))
    dm = ZeroCopyDataModule(dataset, fanouts=[5, 5], batch_size=128, feature_dtype="bfloat16")
    telemetry = DataTelemetry(prog_bar=False)
    pipeline = PipelineCallback(mode="in_process", lookahead=lookahead)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, log_every_n_steps=2,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[pipeline, telemetry])  # fmt: skip
    trainer.fit(GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16, dropout=0.0), datamodule=dm)
    metrics = trainer.callback_metrics
    for key in (*STAGE_KEYS, "data/gather_build_GBps"):
        assert f"{key}_epoch" in metrics and f"{key}_step" in metrics, key
        assert float(metrics[f"{key}_epoch"]) >= 0.0
    assert float(metrics["data/build_gather_ms_epoch"]) > 0 and float(metrics["data/gather_build_GBps_epoch"]) > 0
    assert "data/gather_bound_ms_epoch" not in metrics  # no PCIe on the CPU
    history = telemetry.history
    assert history and all(set(STAGE_KEYS) <= set(step) for step in history)
