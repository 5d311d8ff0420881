"""Starting MPS for a job before CUDA: the trainer's share and the worker's, and the command-line launcher.

``python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent X -- COMMAND`` runs :func:`launch`; the
``lightning-zerocopy`` command calls :func:`start_for_trainer` before it imports anything that loads PyG; the pipeline
callback joins that daemon when the run is set up (:func:`join_for_trainer`). The daemon itself (start, join,
supervisor) is :mod:`lightning_zerocopy.pipeline.mps`. Standard library only at import.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from lightning_zerocopy.pipeline import mps
from lightning_zerocopy.pipeline.mps import MPSDaemon

__all__ = ["DEFAULT_WORKER_SM_PERCENT", "WORKER_PERCENT_ENV", "join_for_trainer", "launch", "start_for_trainer"]

#: The pipeline worker's share of SMs when none is given (the fastest in ``benchmarks/parts/pipeline.py``, see ``docs/BENCHMARK_NOTES.md``).
DEFAULT_WORKER_SM_PERCENT = 10
#: Set by :func:`start_for_trainer` for the worker's share (the trainer's own is ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
WORKER_PERCENT_ENV = "LZC_MPS_WORKER_PERCENT"


def start_for_trainer(worker_percent: int = DEFAULT_WORKER_SM_PERCENT,
                      trainer_percent: Optional[int] = None) -> Optional[MPSDaemon]:  # fmt: skip
    """Start (or join) this job's daemon in a process that has not initialized CUDA yet and will train, with
    ``trainer_percent`` % of the SMs (default ``100 - worker_percent``; 100: not limited) for this process and the
    processes it starts (DDP ranks), and ``worker_percent`` % recorded for the pipeline worker. MPS caps each client,
    it does not partition: the two shares may add up to more than 100. Returns ``None`` after a warning without MPS."""
    if not 1 <= worker_percent <= 99:
        raise ValueError(f"the pipeline worker's SM share must be in [1, 99] %, got {worker_percent}")
    if trainer_percent is not None and not 1 <= trainer_percent <= 100:
        raise ValueError(f"the trainer's SM share must be in [1, 100] %, got {trainer_percent}")
    daemon = mps.start_mps()  # through the module: tests and tools may replace it
    if daemon is not None and daemon.owner:  # a process that joined (a DDP rank) inherited the shares
        os.environ[mps.PERCENT_ENV] = str(100 - worker_percent if trainer_percent is None else trainer_percent)
        os.environ[WORKER_PERCENT_ENV] = str(worker_percent)
    return daemon


def join_for_trainer(worker_percent: int, asked_percent: object = None,
                     trainer_percent: Optional[int] = None) -> Optional[MPSDaemon]:  # fmt: skip
    """Join this job's daemon (started by the ``lightning-zerocopy`` command, the launcher or a parent rank), or start
    one while this process has not initialized CUDA yet; otherwise warn once
    (:class:`~lightning_zerocopy.pipeline.mps.MPSUnavailableWarning`) and return ``None``: the run goes on without
    MPS, since a process that initialized CUDA first can no longer become a client.

    Args:
        worker_percent: the pipeline worker's share of the SMs (the trainer gets the rest) when a daemon starts here.
        asked_percent: the share as the user wrote it (``"auto"``), for the warning's launcher command.
        trainer_percent: the trainer's share when a daemon starts here (default ``100 - worker_percent``).
    """
    import warnings

    if mps.found_unavailable():  # the command (or an earlier call) tried and warned why
        return None
    launched = os.environ.get(mps.ROOT_ENV) is not None  # by the command, the launcher or a parent rank
    if not launched:
        import torch

        if torch.cuda.is_initialized() or mps.cuda_driver_initialized():
            warnings.warn(
                "PipelineCallback(mps=True) found no MPS daemon of this job, and this process has initialized CUDA "
                "already (importing torch_geometric does), so the trainer can no longer become an MPS client; "
                "running without MPS. Start the job with the `lightning-zerocopy` command (it starts MPS before "
                "loading the recipe's classes), through `python -m lightning_zerocopy.pipeline.mps_launcher "
                f"--worker-sm-percent {worker_percent if asked_percent is None else asked_percent}"
                f"{'' if trainer_percent is None else f' --trainer-sm-percent {trainer_percent}'} -- ...`, or call "
                "lightning_zerocopy.pipeline.mps_launcher.start_for_trainer() before anything touches CUDA.",
                mps.MPSUnavailableWarning,
                stacklevel=4,
            )
            return None
    # joins the daemon of the command, the launcher or a parent rank; or starts one, and then this process's CUDA
    # context (created later by the Trainer) and DDP ranks started later get their share
    return start_for_trainer(worker_percent, trainer_percent)


def launch(argv: list[str]) -> None:
    """``python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent X -- COMMAND...``

    Starts this job's MPS daemon, then replaces this process by ``COMMAND`` with the MPS variables in its
    environment from the start (the trainer ``100 - X`` % of the SMs, or ``--trainer-sm-percent``), so the trainer is
    an MPS client however
    early it initializes CUDA. The supervisor stops the daemon when ``COMMAND`` exits (it keeps this pid).
    Without MPS it warns and runs ``COMMAND`` anyway. (``lightning-zerocopy fit`` does this by itself when its
    recipe asks for ``mps: true``.)
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lightning_zerocopy.pipeline.mps_launcher", description=launch.__doc__)
    parser.add_argument("--worker-sm-percent", type=int, default=DEFAULT_WORKER_SM_PERCENT, help="the pipeline worker's share of SMs")
    parser.add_argument("--trainer-sm-percent", type=int, default=None,
                        help="the trainer's share of SMs (default: 100 minus the worker's; 100: not limited)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run (e.g. lightning-zerocopy fit ...)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not 1 <= args.worker_sm_percent <= 99:
        parser.error(f"--worker-sm-percent must be in [1, 99], got {args.worker_sm_percent}")
    if args.trainer_sm_percent is not None and not 1 <= args.trainer_sm_percent <= 100:
        parser.error(f"--trainer-sm-percent must be in [1, 100], got {args.trainer_sm_percent}")
    start_for_trainer(args.worker_sm_percent, args.trainer_sm_percent)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    launch(sys.argv[1:])
