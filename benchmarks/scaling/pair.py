"""Independent runs side by side: one single-GPU fit per GPU at the same time, no DDP between them.

A DDP rank slows when a second one joins (issue 39). Two independent fits on two GPUs share everything a DDP pair
shares on the host (cores, memory bandwidth, PCIe root, one MPS daemon) but no gradient all-reduce and no per-step
coupling: their step rate against a lone fit's separates host contention from DDP. :func:`run_pair` runs in a
process of its own that never touches CUDA: it starts the MPS daemon first where the run asks for one (both fits
join it, as DDP ranks join theirs), then one child per GPU (``CUDA_VISIBLE_DEVICES``, a port of its own), and
:class:`EpochBarrier` starts every epoch of the children together, so their measured epochs overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytorch_lightning as pl
from lightning_fabric.utilities.distributed import _suggested_max_num_threads

__all__ = ["EpochBarrier", "run_pair"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_pair(args: argparse.Namespace, config: dict[str, Any], script: str, cuda: bool, mps: bool, share: int) -> None:
    """Run ``config["gpus"]`` single-GPU fits of ``config`` at once, child ``i`` on the ``i``-th visible GPU, each
    writing ``rank{i}.json`` (its ``slot``); the MPS daemon (``mps``; the pipeline worker's ``share`` %, the
    trainers the rest) started here first.

    Raises:
        SystemExit: a child failed (the exit codes in the message; the others' results stay).
    """
    if mps and cuda:
        from lightning_zerocopy.pipeline.mps_launcher import start_for_trainer

        start_for_trainer(share)  # before any child initializes CUDA: each joins this daemon
    count = int(config["gpus"])
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or [str(i) for i in range(count)]
    barrier = os.path.join(config["out_dir"], "barrier")
    os.makedirs(barrier, exist_ok=True)
    procs = []
    for slot in range(count):
        child = {**config, "independent": False, "gpus": 1, "slot": slot, "barrier": {"dir": barrier, "parties": count}}
        env = dict(os.environ, MASTER_PORT=str(_free_port()))
        # each its share of the cores, as Lightning's launcher gives DDP ranks (unless OMP_NUM_THREADS is set)
        env.setdefault("OMP_NUM_THREADS", str(_suggested_max_num_threads(count)))
        for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):
            env.pop(key, None)
        if cuda:
            env["CUDA_VISIBLE_DEVICES"] = visible[slot]
        procs.append(subprocess.Popen([sys.executable, script, *args.argv, "--child", json.dumps(child)], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"independent runs failed: exit codes {codes} (slot i on visible GPU i)")


class EpochBarrier(pl.Callback):
    """Every epoch of the independent runs starts once all of them reached it (files in a shared folder), or after
    ``timeout_s`` (a sibling that failed or lags; the epochs that waited in vain are kept in :attr:`timeouts`).
    Put it first among the callbacks, so the others' epoch clocks start after it."""

    def __init__(self, directory: str, parties: int, slot: int, timeout_s: float = 120.0) -> None:
        self.directory, self.parties, self.slot, self.timeout_s = directory, int(parties), int(slot), float(timeout_s)
        self.timeouts: list[int] = []

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.wait(f"epoch{trainer.current_epoch}")

    def wait(self, name: str) -> bool:
        """Mark ``name`` reached by this run and wait for the others; ``False`` after the timeout."""
        open(os.path.join(self.directory, f"{name}.{self.slot}"), "w").close()
        deadline = time.monotonic() + self.timeout_s
        while sum(f.startswith(name + ".") for f in os.listdir(self.directory)) < self.parties:
            if time.monotonic() > deadline:
                self.timeouts.append(int(name[5:]) if name.startswith("epoch") else -1)
                return False
            time.sleep(0.005)
        return True
