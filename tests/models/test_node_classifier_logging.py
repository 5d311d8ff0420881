"""NodeClassifier and DataTelemetry hand their figures to Lightning every ``log_every_n_steps`` and at an epoch's
end, never in between (a figure logged every step synchronizes every GPU step), with exact epoch aggregates."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.loggers.logger import Logger
from torchmetrics import Metric

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE

LOG_EVERY = 4
STEPS = 10  # per epoch: 640 training nodes in batches of 64


class _Recorder(Logger):
    """What reaches the logger: ``(step, metrics)`` per call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.calls.append((step, dict(metrics)))

    def steps_with(self, key: str) -> list[int]:
        return [step for step, metrics in self.calls if key in metrics]

    def value(self, key: str, step: int) -> float:
        return next(metrics[key] for s, metrics in self.calls if s == step and key in metrics)


class _Truth(Callback):
    """Each step's loss, correct and labeled seeds, computed beside the model (its weights never change: lr 0),
    every ``pl_module.log`` call with the step it came from, and the telemetry history's length per epoch."""

    def __init__(self, telemetry: DataTelemetry) -> None:
        self.telemetry = telemetry
        self.steps: list[tuple[float, int, int]] = []
        self.log_calls: list[tuple[int, str, object]] = []
        self.epoch_ends: list[int] = []
        self.hook, self.step = "", -1

    def setup(self, trainer, pl_module, stage) -> None:
        original = pl_module.log

        def log(name, value, *args, **kwargs):
            self.log_calls.append((self.step, self.hook, name, value))
            return original(name, value, *args, **kwargs)

        pl_module.log = log

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.hook, self.step = "step", trainer.global_step  # the step's index (global_step moves at its end)
        with torch.no_grad():
            out, y = pl_module._seed_logits(batch)
            labeled = y != -1
            loss = float(F.cross_entropy(out, y, ignore_index=-1)) if labeled.any() else 0.0
            self.steps.append((loss, int(((out.argmax(-1) == y) & labeled).sum()), int(labeled.sum())))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.hook = "epoch_end"
        self.epoch_ends.append(len(self.telemetry.history))

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.hook = "epoch_start"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory):
    tmp_path: Path = tmp_path_factory.mktemp("logging")
    dataset = SyntheticGraph(num_nodes=1000, num_features=16, num_classes=4, train_fraction=0.64, val_fraction=0.1,
                             cache_dir=str(tmp_path / "data"))  # fmt: skip
    dm = ZeroCopyDataModule(dataset, fanouts=[5, 5], batch_size=64, seed=1)
    model = GraphSAGE(16, 4, hidden_channels=16, dropout=0.0, optimizer=partial(torch.optim.SGD, lr=0.0))
    telemetry = DataTelemetry(prog_bar=True)
    truth, recorder = _Truth(telemetry), _Recorder()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, log_every_n_steps=LOG_EVERY, logger=recorder,
        limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[telemetry, truth], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert len(truth.steps) == 2 * STEPS
    return trainer, truth, recorder, telemetry


def test_step_figures_are_handed_over_only_on_log_steps_and_at_epoch_end(fitted) -> None:
    trainer, truth, recorder, _ = fitted
    log_steps = {s for s in range(2 * STEPS) if (s + 1) % LOG_EVERY == 0}
    last_batches = {STEPS - 1, 2 * STEPS - 1}
    from_steps = [(step, name, value) for step, hook, name, value in truth.log_calls if hook == "step"]
    assert from_steps, "nothing was logged during the steps"
    assert {step for step, _, _ in from_steps} <= log_steps | last_batches
    # values are CPU tensors (a Python number becomes a tensor on the module's device) or the epoch's Metric
    assert all(isinstance(v, Metric) or (isinstance(v, torch.Tensor) and v.device.type == "cpu") for *_, v in truth.log_calls)
    for key in ("train_loss", "train_acc_step", "data/stall_frac_step", "data/seps_step"):
        assert recorder.steps_with(key) == sorted(log_steps), key
    assert {"train_loss", "train_acc_step", "stall", "MEPS"} <= set(trainer.progress_bar_metrics)


def test_a_hand_over_carries_the_mean_of_the_steps_since_the_last_one(fitted) -> None:
    _, truth, recorder, _ = fitted
    for last in (7, 11):  # steps 4..7 (epoch 0); steps 10..11 (epoch 1 starts a new window at its step 10)
        first = last - LOG_EVERY + 1 if last < STEPS else STEPS
        window = truth.steps[first : last + 1]
        labeled = sum(n for *_, n in window)
        assert recorder.value("train_loss", last) == pytest.approx(sum(loss * n for loss, _, n in window) / labeled, rel=1e-5)
        assert recorder.value("train_acc_step", last) == pytest.approx(sum(c for _, c, _ in window) / labeled, rel=1e-12)


def test_epoch_figures_are_exact(fitted) -> None:
    _, truth, recorder, telemetry = fitted
    epoch_logs = [metrics for _, metrics in recorder.calls if "train_acc_epoch" in metrics]
    assert len(epoch_logs) == 2
    start = 0
    for epoch, metrics in enumerate(epoch_logs):
        steps = truth.steps[epoch * STEPS : (epoch + 1) * STEPS]
        assert metrics["train_acc_epoch"] == sum(c for _, c, _ in steps) / sum(n for *_, n in steps)
        history = telemetry.history[start : truth.epoch_ends[epoch]]
        start = truth.epoch_ends[epoch]
        assert len(history) == STEPS - 1  # every step interval of the epoch (the first step has none before it)
        stall, interval = sum(h["data/stall_ms"] for h in history), sum(h["data/step_ms"] for h in history)
        assert metrics["data/stall_frac_epoch"] == pytest.approx(stall / interval, rel=1e-9)
        assert metrics["data/step_ms_epoch"] == pytest.approx(interval / len(history), rel=1e-9)
