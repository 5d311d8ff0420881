"""A callback the CUDA CLI tests put in a recipe: at the first training batch it measures the trainer's bf16
matmul rate (after a pause, so that the worker has filled its slots and waits), prints one line,
``READY {json}``, naming the trainer, the pipeline worker and the MPS daemon, then slows the steps down so
that the test can interrupt training mid-epoch."""

from __future__ import annotations

import json
import os
import time

from pytorch_lightning.callbacks import Callback

from helpers import matmul_tflops
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.pipeline import mps


class ReportAndDawdle(Callback):
    def __init__(self, dawdle: float = 0.05) -> None:
        self.dawdle = dawdle
        self._reported = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._reported:
            self._reported = True
            pipeline = next(cb for cb in trainer.callbacks if isinstance(cb, PipelineCallback))
            transport = pipeline.client.transport
            daemon = pipeline.mps_daemon
            info = {
                "trainer_pid": os.getpid(),
                "worker_pid": getattr(transport, "pid", None),
                "mps_root": daemon.root if daemon is not None else None,
                "mps_daemon_pid": daemon.daemon_pid if daemon is not None else None,
                # the command started the daemon and its supervisor; the callback joined (state file has the pid)
                "mps_supervisor_pid": (mps._read_state(daemon.root) or {}).get("supervisor_pid") if daemon else None,
                "trainer_percent": os.environ.get(mps.PERCENT_ENV),
                "batch_on_cuda": bool(batch.x.is_cuda),
            }
            time.sleep(1.0)  # the worker fills the free slot and then waits: the GPU is the trainer's
            info["trainer_tflops"] = matmul_tflops()
            print("READY " + json.dumps(info), flush=True)
        time.sleep(self.dawdle)
