"""The SIGTERM handling of the command (:mod:`lightning_zerocopy.preemption`), in process: a SIGTERM during a fit saves
the state after the current step and raises Lightning's ``SIGTERMException``; one outside a fit stops at once with
exit status 143; one while stopping is only noted. The real signal on CPU ranks: ``tests/test_cli_preemption.py``."""

from __future__ import annotations

import os
import signal

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lightning_zerocopy import ZeroCopyDataModule, preemption
from lightning_zerocopy.datasets import SyntheticGraph


@pytest.fixture
def sigterm_handled():
    previous = signal.getsignal(signal.SIGTERM)
    saved = preemption.RECORD
    preemption.RECORD = preemption.PreemptionRecord()
    preemption.install()
    yield preemption.RECORD
    signal.signal(signal.SIGTERM, previous)
    preemption.RECORD = saved
    preemption._ACTIVE = None


def test_a_sigterm_outside_a_fit_stops_at_once_with_143_and_a_later_one_is_only_noted(sigterm_handled, capsys) -> None:
    with pytest.raises(preemption.PreemptedNow) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
    assert raised.value.code == 143 and sigterm_handled.stopping
    os.kill(os.getpid(), signal.SIGTERM)  # already stopping: noted, nothing raised
    assert sigterm_handled.signals == 2 and "already stopping" in capsys.readouterr().err
    assert "before a training step finished" in preemption.report()


class _Tiny(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.conv = SAGEConv(in_channels, out_channels)

    def training_step(self, data, batch_idx):
        if batch_idx == 2 and self.current_epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, in the middle of step 2 of epoch 1
        out = self.conv(data.x, data.edge_index)[: data.batch_size]
        return torch.nn.functional.cross_entropy(out, data.y[: data.batch_size])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_sigterm_in_a_step_saves_the_state_after_that_step_as_last_ckpt(sigterm_handled, tmp_path) -> None:
    dataset = SyntheticGraph(num_nodes=600, avg_degree=4, num_features=8, num_classes=3, cache_dir=str(tmp_path / "c"))
    dm = ZeroCopyDataModule(dataset, fanouts=[3], batch_size=32)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=5, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path), limit_val_batches=0,
                         callbacks=[preemption.PreemptionCheckpoint()])  # fmt: skip
    with pytest.raises(SIGTERMException):
        trainer.fit(_Tiny(dataset.num_features, dataset.num_classes), datamodule=dm)
    path = tmp_path / "checkpoints" / "last.ckpt"
    assert sigterm_handled.checkpoint == str(path) and path.is_file()
    assert not list(path.parent.glob("*.tmp-*"))
    state = torch.load(path, map_location="cpu", weights_only=False)
    per_epoch = trainer.num_training_batches
    assert state["global_step"] == per_epoch + 3 and state["epoch"] == 1  # step 2 of epoch 1 finished, no later one
    assert (sigterm_handled.epoch, sigterm_handled.batch) == (1, 3)
    assert f"is saved in {path}" in preemption.report()
    with pytest.raises(SystemExit) as exited:
        preemption.exit_if_preempted(SIGTERMException())
    assert exited.value.code == preemption.PREEMPTED_EXIT


def test_lightnings_per_step_sigterm_broadcast_runs_only_under_another_handler(sigterm_handled) -> None:
    """Lightning's step-start broadcast (a device tensor, a broadcast, ``.item()``: a host-device sync every step under
    several ranks) is skipped while our handler runs the SIGTERM stop through the store, and runs under any other."""
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    calls: list[int] = []
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: calls.append(1)  # Lightning's, standing in
    preemption.PreemptionCheckpoint().setup(trainer, pl.LightningModule(), "fit")
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert calls == []
    preemption.skip_lightnings_step_broadcast(trainer)  # a second call wraps nothing twice
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert calls == [1]


def test_this_lightning_still_broadcasts_at_the_start_of_a_step() -> None:
    """What the skip above replaces exists (a Lightning without it makes the skip a no-op, and this test says so)."""
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert callable(getattr(trainer.fit_loop.epoch_loop, "_broadcast_sigterm_tensor", None))
