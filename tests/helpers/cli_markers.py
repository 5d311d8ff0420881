"""A callback that CLI fault tests add to a recipe (``--trainer.callbacks+=helpers.cli_markers.MarkTraining``): each
rank writes ``pid<rank>`` at setup (``processes<rank>.json``: ``{"pid", "worker_pid", "mps_daemon_pid"}`` once training
runs) and ``training<rank>`` at its second training batch into ``$LZC_TEST_MARKERS``, then sleeps a little per batch, so
that a test can interrupt training mid-epoch. A test that writes ``abort<rank>`` there makes that rank call ``abort()``
at its next batch, as a C++ ``std::terminate`` does (a SIGABRT sent from outside is not the same fault: a library may
catch it and carry on)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from pytorch_lightning.callbacks import Callback

from helpers.signal_handlers import native_handler


class MarkTraining(Callback):
    def __init__(self, dawdle: float = 0.05) -> None:
        self.dawdle = dawdle
        self.out = Path(os.environ["LZC_TEST_MARKERS"])

    def setup(self, trainer, pl_module, stage) -> None:
        (self.out / f"pid{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 1:
            (self.out / f"processes{trainer.global_rank}.json").write_text(json.dumps(_processes(trainer)))
            (self.out / f"training{trainer.global_rank}").touch()
        if (self.out / f"abort{trainer.global_rank}").exists():
            os.abort()
        time.sleep(self.dawdle)


def _processes(trainer) -> dict:
    from lightning_zerocopy.callbacks import PipelineCallback

    found = {"pid": os.getpid(), "worker_pid": None, "mps_daemon_pid": None, "mps_root": None,
             "sigabrt_handler": native_handler(signal.SIGABRT)}
    pipeline = next((cb for cb in trainer.callbacks if isinstance(cb, PipelineCallback)), None)
    if pipeline is not None and pipeline.client is not None:
        found["worker_pid"] = getattr(pipeline.client.transport, "pid", None)
    daemon = getattr(pipeline, "mps_daemon", None)
    if daemon is not None:
        found["mps_daemon_pid"], found["mps_root"] = daemon.daemon_pid, daemon.root
    return found


class RecordTrainedSeeds(Callback):
    """Appends ``[epoch, batch_idx, seeds]`` of every finished training batch to ``seeds<rank>.jsonl`` in
    ``$LZC_TEST_MARKERS`` (flushed per batch: the run may be stopped at any step), and the training split's node ids
    to ``train_idx.json`` at the start of training."""

    def __init__(self) -> None:
        self.out = Path(os.environ["LZC_TEST_MARKERS"])

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            ids = trainer.datamodule.plan("train").input_nodes.tolist()
            (self.out / "train_idx.json").write_text(json.dumps(ids))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        seeds = batch.n_id[: batch.batch_size].tolist()
        with open(self.out / f"seeds{trainer.global_rank}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps([trainer.current_epoch, batch_idx, seeds]) + "\n")
