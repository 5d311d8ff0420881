"""LIGHTNING_ZEROCOPY_TRAINER_PROFILE: a window of a row's training steps profiled in the trainer."""

from __future__ import annotations

import json
import os

import pytest
import pytorch_lightning as pl
import torch

from benchmarks.common.step_profile import (
    TRAINER_PROFILE_ENV,
    StepProfile,
    route_worker_profile,
    step_profile_callbacks,
)
from lightning_zerocopy.pipeline.worker_profile import PROFILE_ENV


class _Labelled(pl.LightningModule):
    """A linear model whose training steps leave ``step_<index>`` in a profile."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        with torch.profiler.record_function(f"step_{batch_idx}"):
            return self.net(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(10, 4), batch_size=1)


def test_only_the_window_of_steps_is_profiled_under_the_rows_name(tmp_path, monkeypatch):
    monkeypatch.setenv(TRAINER_PROFILE_ENV, f"{tmp_path}:2:3")
    callbacks = step_profile_callbacks("zc_gpu_mps-heavy")
    assert [type(c) for c in callbacks] == [StepProfile]
    during_training = []

    class _Look(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            during_training.extend(os.listdir(tmp_path))

    trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[*callbacks, _Look()])  # fmt: skip
    trainer.fit(_Labelled())
    assert during_training == []  # written after training, not inside the timed steps
    pid = os.getpid()
    assert sorted(os.listdir(tmp_path)) == [f"trainer_zc_gpu_mps-heavy_ops_{pid}.txt",
                                            f"trainer_zc_gpu_mps-heavy_trace_{pid}.json"]  # fmt: skip
    trace = json.load(open(tmp_path / f"trainer_zc_gpu_mps-heavy_trace_{pid}.json"))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"step_2", "step_3", "step_4"} <= names and not names & {"step_0", "step_1", "step_5", "step_7"}


def test_unset_no_callback_and_a_bad_value_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(TRAINER_PROFILE_ENV, raising=False)
    assert step_profile_callbacks("row") == []
    monkeypatch.setenv(TRAINER_PROFILE_ENV, f"{tmp_path}:1:0")
    with pytest.raises(ValueError, match=f"{TRAINER_PROFILE_ENV}=.*<dir>"):
        step_profile_callbacks("row")


def test_a_rows_worker_traces_go_into_a_folder_of_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, f"{tmp_path}:300:40")
    route_worker_profile("zc_gpu_mps_depth3")
    assert os.environ[PROFILE_ENV] == f"{tmp_path / 'zc_gpu_mps_depth3'}:300:40"  # the worker's transport makes it
    monkeypatch.delenv(PROFILE_ENV)
    route_worker_profile("zc_gpu_mps")
    assert PROFILE_ENV not in os.environ


@pytest.mark.parametrize("env", [TRAINER_PROFILE_ENV, PROFILE_ENV])
def test_the_benchmark_names_a_bad_profile_variable_before_any_row(env, tmp_path, monkeypatch, capsys):
    from benchmarks.end_to_end.__main__ import parse_args

    monkeypatch.setenv(env, f"{tmp_path}:x")
    with pytest.raises(SystemExit):
        parse_args(["--configs", "model_only"])
    assert f"{env}=" in capsys.readouterr().err
