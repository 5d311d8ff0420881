"""``PipelineCallback``: build the DataModule's batches ahead of the trainer, in a worker process or a thread.

Put it in a recipe's ``trainer.callbacks``; nothing else changes::

    trainer:
      callbacks:
        - class_path: lightning_zerocopy.callbacks.PipelineCallback
          init_args: {mode: worker, depth: 2, mps: true, worker_sm_percent: 10}

The batches are the ones the DataModule yields without it (its own plan and ``build_batch`` run in the
producer), so toggling the callback changes where batches are made, never what they contain.

How it hooks in: the :class:`~lightning_zerocopy.data.ZeroCopyDataModule` calls
:meth:`PipelineCallback.attach_host_memory` during ``setup`` while its shared memory can still be opened by
name; the callback starts the producer there, has it open the builders, and hands the DataModule a loader
factory (:meth:`ZeroCopyDataModule.use_loader_factory`) that wraps its loaders in a
:class:`~lightning_zerocopy.pipeline.loader.PipelineLoader`; ``teardown`` hands it back (``None``).

MPS: a process becomes an MPS client only if the daemon runs, and the MPS variables are in its environment,
when it initializes the CUDA driver; ``import torch_geometric`` already does that (``docs/BENCHMARK_NOTES.md``, "When
does a process become an MPS client?"), and
every recipe's DataModule or model imports PyG before LightningCLI constructs the callbacks. So whoever starts
the process starts MPS: the ``lightning-zerocopy`` command reads the recipe first and, for ``mps: true``, starts a
private daemon before it imports anything else (:func:`lightning_zerocopy.cli.main`); other entry points run
under ``python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent X -- COMMAND``, or a script calls
:func:`lightning_zerocopy.pipeline.mps_launcher.start_for_trainer` before anything touches CUDA (importing this module
imports no PyG). The callback only joins that daemon when the run is set up (:meth:`PipelineCallback.join_mps`;
it warns and runs without MPS when there is none and it is too late to start one); the worker it starts gets
``worker_sm_percent`` % of the SMs, the trainer the rest. DDP ranks started later by Lightning's launcher
inherit the variables and join the same daemon.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from lightning_zerocopy.options import check_depth
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline import mps as mps_control
from lightning_zerocopy.pipeline import mps_launcher
from lightning_zerocopy.pipeline.mps_launcher import DEFAULT_WORKER_SM_PERCENT

if TYPE_CHECKING:
    from lightning_zerocopy.pipeline.client import PipelineClient
    from lightning_zerocopy.pipeline.share_choice import ShareChoice

# PyG initializes the CUDA driver when imported, so nothing that imports it (pipeline.loader, pipeline.source)
# is imported here at module level: a script may import this callback before it starts MPS.

Mode = Literal["auto", "worker", "in_process"]

_STAGES_OF = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
}


class PipelineCallback(Callback):
    """Sample and gather mini-batches ahead of the training step, overlapped with it.

    Args:
        mode: ``"worker"``: a worker process builds batches into GPU (or shared host) slots it shares with
            the trainer over CUDA IPC; ``"in_process"``: a producer thread of the trainer builds them on side
            CUDA streams; ``"auto"``: the fastest mode for the setup in ``benchmarks/micro/pipeline.py`` (see
            :meth:`resolve_mode`).
        depth: batch slots per loader; 2 is ping-pong (one being trained on, one being filled).
        mps: run the trainer and the worker as clients of a private CUDA MPS daemon, the worker limited to
            ``worker_sm_percent`` % of the SMs and the trainer to the rest. Warns once and runs without it when
            MPS is unavailable. Only for ``mode="worker"`` on a GPU.
        worker_sm_percent: the producer's share of SMs: the worker's under MPS (the trainer gets
            ``100 - worker_sm_percent``), or the in-process producer's with ``green_context``. ``"auto"`` (worker
            under MPS on a GPU): the smallest of 10, 20 and 30 % whose measured build time fits in the step
            (:mod:`~lightning_zerocopy.callbacks.share_auto`; the trainer gets 90 %).
        lookahead: three stages: the producer samples batch ``t + 2`` on a thread of its own while it gathers
            batch ``t + 1`` into a slot and the trainer trains on batch ``t``.
        green_context: in-process mode on a GPU: run the producer's kernels on CUDA green-context streams
            limited to ``worker_sm_percent`` % of the SMs, while training keeps the whole GPU (no daemon, no
            second process). Needs a PyTorch whose ``GreenContext`` has ``Stream()``; warns once and runs
            without the share otherwise. ``mode="auto"`` then means ``in_process``.
        timeout: seconds to wait for one batch from a live producer before raising.
        copy_stages: loaders whose batches are handed over as copies instead of views of their slot. Default
            ``("predict",)``: ``predict_step`` outputs are collected by Lightning and often contain batch fields
            (``batch.n_id``), which a view would let the next batch overwrite.

    A batch of the other loaders is a view of its slot and stays valid until the next batch of that loader is
    requested (after the step's backward): copy a field to keep it longer.

    The constructor only stores the configuration: the MPS daemon is joined (:meth:`join_mps`) and the producer
    started when the DataModule's ``setup`` attaches the callback; both are released at ``teardown``.
    """

    def __init__(
        self,
        mode: Mode = "auto",
        depth: int = 2,
        mps: bool = False,
        worker_sm_percent: Union[int, Literal["auto"]] = DEFAULT_WORKER_SM_PERCENT,
        timeout: float = 600.0,
        copy_stages: Sequence[str] = ("predict",),
        lookahead: bool = True,
        green_context: bool = False,
    ) -> None:
        if mode not in ("auto", "worker", "in_process"):
            raise ValueError(f"PipelineCallback(mode=...) must be 'auto', 'worker' or 'in_process', got {mode!r}")
        check_depth(depth, "PipelineCallback")
        if worker_sm_percent == "auto":
            if not mps or green_context:
                raise ValueError(
                    "PipelineCallback(worker_sm_percent='auto') chooses the worker's MPS share: set mps: true "
                    "(and no green_context), or give the share as a number"
                )
        elif isinstance(worker_sm_percent, bool) or not isinstance(worker_sm_percent, int) or not 1 <= worker_sm_percent <= 99:
            raise ValueError(
                f"PipelineCallback(worker_sm_percent=...) must be in [1, 99] or 'auto', got {worker_sm_percent!r}"
            )
        if mps and mode == "in_process":
            raise ValueError("PipelineCallback(mps=True) needs a worker process: use mode 'worker' or 'auto'")
        if green_context and (mps or mode == "worker"):
            raise ValueError(
                "PipelineCallback(green_context=True) shares SMs with an in-process producer: use mode 'in_process' "
                "or 'auto' without mps (a worker process gets its share from MPS)"
            )
        self.mode: Mode = mode
        self.depth = depth
        self.mps = mps
        self.worker_sm_percent = worker_sm_percent
        self.timeout = timeout
        unknown = set(copy_stages) - {"train", "val", "test", "predict"}
        if unknown:
            raise ValueError(f"PipelineCallback(copy_stages=...) takes 'train', 'val', 'test', 'predict'; got {sorted(unknown)}")
        self.copy_stages = tuple(copy_stages)
        self.lookahead = bool(lookahead)
        self.green_context = bool(green_context)
        self.mps_daemon = None
        self.client: Optional["PipelineClient"] = None
        self._auto: Any = None  # the AutoShare of worker_sm_percent="auto" while it calibrates
        self._last_choice: Optional["ShareChoice"] = None  # the last closed AutoShare's choice (None: undecided)
        self._mps_checked = False
        self._datamodule: Any = None  # the DataModule using this callback's loader factory
        self._stages: tuple[str, ...] = ()

    # ---- MPS ---------------------------------------------------------------------------------------------------
    def join_mps(self) -> Optional["mps_control.MPSDaemon"]:
        """Join the MPS daemon this job's launcher started (``mps=True``; once, idempotent) and return it.

        Called when the run is set up (the DataModule attaching the callback, ``setup``, :meth:`resolve_mode`).
        Without a daemon of the job it starts one only if this process has not initialized CUDA yet; otherwise
        it warns once (:class:`~lightning_zerocopy.pipeline.mps.MPSUnavailableWarning`) and the run goes on
        without MPS.
        """
        if not self.mps or self._mps_checked:
            return self.mps_daemon
        self._mps_checked = True
        if mps_control.found_unavailable():  # the command (or an earlier callback) tried and warned why
            return None
        launched = os.environ.get(mps_control.ROOT_ENV) is not None  # by the command, the launcher or a parent rank
        if not launched and (torch.cuda.is_initialized() or mps_control.cuda_driver_initialized()):
            warnings.warn(
                "PipelineCallback(mps=True) found no MPS daemon of this job, and this process has initialized CUDA "
                "already (importing torch_geometric does), so the trainer can no longer become an MPS client; "
                "running without MPS. Start the job with the `lightning-zerocopy` command (it starts MPS before "
                "loading the recipe's classes), through `python -m lightning_zerocopy.pipeline.mps_launcher "
                f"--worker-sm-percent {self.worker_sm_percent} -- ...`, or call "
                "lightning_zerocopy.pipeline.mps_launcher.start_for_trainer() before anything touches CUDA.",
                mps_control.MPSUnavailableWarning,
                stacklevel=3,
            )
            return None
        # joins the daemon of the command, the launcher or a parent rank; or starts one, and then this process's
        # CUDA context (created later by the Trainer) and DDP ranks started later get 100 - worker_sm_percent %
        self.mps_daemon = mps_launcher.start_for_trainer(self._first_share)
        return self.mps_daemon

    @property
    def _first_share(self) -> int:
        """The worker's share at start (``"auto"``: the smallest of the ladder)."""
        if self.worker_sm_percent == "auto":
            from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER

            return SHARE_LADDER[0]
        return int(self.worker_sm_percent)

    def _worker_env(self, percent: Optional[int] = None) -> dict[str, str]:
        if self.mps_daemon is None:
            return {}
        return self.mps_daemon.client_env(self._first_share if percent is None else percent)

    # ---- wiring into the DataModule ---------------------------------------------------------------------------
    def resolve_mode(self, device: torch.device, gpu_builder: bool = False) -> str:
        """The mode ``auto`` stands for on ``device``, for a DataModule whose batches are built on the GPU
        (``gpu_builder``: GPU/UVA sampling or the zero-copy gather) or on the CPU.

        With a running MPS daemon: the worker. Without MPS (not asked for, or unavailable): ``in_process`` for a
        GPU builder (a worker process outside MPS time-slices the GPU with the trainer), ``worker`` for a CPU
        builder (it keeps the trainer's interpreter free). On the CPU: ``in_process`` (a second process only
        competes for the same cores and costs a spawn). The figures behind this choice (``benchmarks/micro/pipeline.py``)
        are in ``docs/BENCHMARK_NOTES.md``, "Three-stage producer, green contexts and the ``auto`` mode".
        """
        if self.mode != "auto":
            return self.mode
        if device.type != "cuda" or self.green_context:
            return "in_process"
        if self.join_mps() is not None:
            return "worker"
        return "in_process" if gpu_builder else "worker"

    def attach_host_memory(self, trainer: "pl.Trainer", datamodule: Any) -> None:
        """Start the producer, have it open this run's batch sources, and give the DataModule the loader factory
        (called by the DataModule's ``setup``, before the callbacks' ``setup``)."""
        for name in ("plan", "builder", "use_loader_factory"):
            if not callable(getattr(datamodule, name, None)):
                raise TypeError(
                    f"PipelineCallback needs a DataModule with plan(split), builder(split) and use_loader_factory("
                    f"factory) (e.g. lightning_zerocopy.ZeroCopyDataModule); {type(datamodule).__name__} has no {name}()"
                )
        from lightning_zerocopy.pipeline.source import PlanSource

        self._shutdown()
        self.join_mps()  # before the worker starts: it gets its share from the daemon's variables
        device = trainer.strategy.root_device
        slot_device = device if device.type == "cuda" else torch.device("cpu")
        mode = self.resolve_mode(device, gpu_builder=getattr(datamodule, "batch_device_type", "cpu") == "cuda")
        fn = trainer.state.fn.value if trainer.state.fn is not None else "fit"
        green = self._first_share if self.green_context and slot_device.type == "cuda" else None
        stages = _STAGES_OF.get(fn, ())

        def start(percent: Optional[int] = None, standby: bool = False) -> "PipelineClient":
            client = start_pipeline(
                mode, self.depth, slot_device, worker_env=self._worker_env(percent), timeout=self.timeout,
                lookahead=self.lookahead, green_context_percent=green,
            )  # fmt: skip
            try:
                for stage in stages:
                    source = PlanSource(datamodule.plan(stage), datamodule.builder(stage), place_on_open=not standby)
                    client.register(stage, source)
            except BaseException:
                client.close()
                raise
            return client

        try:
            # auto calibrates on training steps: only a fit has them (other runs keep the ladder's first share)
            if (self.worker_sm_percent == "auto" and fn == "fit" and mode == "worker" and self.mps_daemon is not None
                    and slot_device.type == "cuda"):  # fmt: skip
                from lightning_zerocopy.callbacks.share_auto import AutoShare

                self._auto = AutoShare(start, slot_device)  # a worker per share, started while the names exist
                self.client = self._auto.active
            else:
                self.client = start()
            self._stages, self._datamodule = tuple(stages), datamodule
            datamodule.use_loader_factory(self.pipelined_loader)
        except BaseException:
            self._shutdown()
            raise

    def pipelined_loader(self, split: str, loader: Any) -> Any:
        """The loader factory given to the DataModule: ``loader`` as a
        :class:`~lightning_zerocopy.pipeline.loader.PipelineLoader` fed by the producer, for the splits this run
        registered (others are returned as they are)."""
        if self.client is None or split not in self._stages:
            return loader
        from lightning_zerocopy.pipeline.loader import PipelineLoader

        current = (lambda: self.client) if self._auto is not None else None
        return PipelineLoader(self.client, split, loader, copy=split in self.copy_stages, current=current)

    def _shutdown(self) -> None:
        datamodule, self._datamodule, self._stages = self._datamodule, None, ()
        if datamodule is not None:
            datamodule.use_loader_factory(None)
        auto, self._auto = self._auto, None
        if auto is not None:
            self._last_choice = auto.calibrator.choice
            self.client = None
            auto.close()
        if self.client is not None:
            client, self.client = self.client, None
            client.close()

    # ---- Lightning hooks ---------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self.join_mps()
        if self.client is None:
            dm = trainer.datamodule
            raise RuntimeError(
                "PipelineCallback was not attached: its DataModule must call attach_host_memory(trainer, self) in "
                f"setup, as lightning_zerocopy.ZeroCopyDataModule does (got {type(dm).__name__ if dm else 'none'})"
            )

    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        if self._auto is not None:
            self._auto.step_started()

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        auto = self._auto
        if auto is not None and self.client is not None:
            auto.step_ended(self.client.stats.last_build_s)
            self.client = auto.active  # the loaders take their next batch from it

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._shutdown()

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._shutdown()

    @property
    def stats(self):
        """Running figures of the producer (:class:`~lightning_zerocopy.pipeline.PipelineStats`), or None."""
        return self.client.stats if self.client is not None else None

    @property
    def share_choice(self) -> Optional["ShareChoice"]:
        """With ``worker_sm_percent="auto"``: the calibration's choice with its figures (share, build and step ms,
        whether it keeps pace), kept after ``teardown``; None before it decides, when the fit ended first, or for a
        share given as a number."""
        if self._auto is not None:
            return self._auto.calibrator.choice
        return self._last_choice

    @property
    def chosen_worker_sm_percent(self) -> Optional[int]:
        """The worker's share of SMs this run settled on: ``worker_sm_percent`` when given as a number; with
        ``"auto"``, the share the calibration chose (:attr:`share_choice`), or None while it has not decided."""
        if self.worker_sm_percent != "auto":
            return int(self.worker_sm_percent)
        choice = self.share_choice
        return None if choice is None else choice.percent
