"""``PipelineCallback``: build the DataModule's batches ahead of the trainer, in a worker process or a thread.

The batches are the ones the DataModule yields without it (its own plan and ``build_batch`` run in the
producer), so toggling the callback changes where batches are made, never what they contain.

How it hooks in: the :class:`~lightning_zerocopy.data.ZeroCopyDataModule` calls
:meth:`PipelineCallback.attach_host_memory` during ``setup`` while its shared memory can still be opened by
name; the callback starts the producers there (a :class:`~lightning_zerocopy.pipeline.session.PipelineSession`),
which open the builders, and hands the DataModule a loader factory
(:meth:`ZeroCopyDataModule.use_loader_factory`) that wraps its loaders in a
:class:`~lightning_zerocopy.pipeline.loader.PipelineLoader`; ``teardown`` hands it back (``None``).

MPS: a process becomes an MPS client only if the daemon runs, and the MPS variables are in its environment,
when it initializes the CUDA driver; ``import torch_geometric`` already does that (``docs/BENCHMARK_NOTES.md``, "When
does a process become an MPS client?"), and
every recipe's DataModule or model imports PyG before LightningCLI constructs the callbacks. So whoever starts
the process starts MPS (:mod:`lightning_zerocopy.pipeline.mps_launcher`; the ``lightning-zerocopy`` command does it
from the recipe, and importing this module imports no PyG); the callback only joins that daemon when the run is set
up (:meth:`PipelineCallback.join_mps`). The worker it starts gets ``worker_sm_percent`` % of the SMs, the trainer the
rest; DDP ranks started later by Lightning's launcher inherit the variables and join the same daemon.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from lightning_zerocopy.data.process_group_exit import run_failed
from lightning_zerocopy.exit_trace import trace_a_slow_exit
from lightning_zerocopy.pipeline import mps, mps_launcher
from lightning_zerocopy.pipeline.mps_launcher import DEFAULT_WORKER_SM_PERCENT
from lightning_zerocopy.pipeline.session import PipelineSession, check_pipeline_options, first_share
from lightning_zerocopy.pipeline.share_numerics import (
    MPSShareNumericsError,
    ensure_share_computes_right,
    linear_widths,
    suggest_shares,
)

#: seconds a producer gets to stop when the run stops on an exception, before it is ended: a worker behind a stream
#: that never drains (a collective a stopping peer never joins) never stops, and the job has ~10 s to end
EXCEPTION_CLOSE_S = 1.0

if TYPE_CHECKING:
    from lightning_zerocopy.pipeline.client import PipelineClient, PipelineStats
    from lightning_zerocopy.pipeline.mps import MPSDaemon
    from lightning_zerocopy.pipeline.share_choice import ShareChoice

# PyG initializes the CUDA driver when imported, so nothing that imports it (pipeline.loader, pipeline.source)
# is imported here, nor by pipeline.session at module level: a script may import this callback before it starts MPS.

Mode = Literal["auto", "worker", "in_process"]


class PipelineCallback(Callback):
    """Sample and gather mini-batches ahead of the training step, overlapped with it.

    Args:
        mode: ``"worker"``: a worker process builds batches into GPU (or shared host) slots it shares with
            the trainer over CUDA IPC; ``"in_process"``: a producer thread of the trainer builds them on side
            CUDA streams; ``"auto"``: the fastest mode for the setup in ``benchmarks/parts/pipeline.py`` (see
            :meth:`resolve_mode`).
        depth: batch slots per loader; 2 is ping-pong (one being trained on, one being filled).
        mps: run the trainer and the worker as clients of a private CUDA MPS daemon, the worker limited to
            ``worker_sm_percent`` % of the SMs and the trainer to the rest. Warns once and runs without it when
            MPS is unavailable. Only for ``mode="worker"`` on a GPU.
        worker_sm_percent: the producer's share of SMs: the worker's under MPS (the trainer gets
            ``100 - worker_sm_percent``), or the in-process producer's with ``green_context``. ``"auto"`` (worker
            under MPS on a GPU): the smallest of 10, 20 and 30 % whose measured build time fits in the step
            (:mod:`~lightning_zerocopy.pipeline.share_auto`; the trainer gets 90 %).
        trainer_sm_percent: the trainer's own MPS share, default ``100 - worker_sm_percent``; 100 leaves it the whole
            GPU (MPS caps each client, the two may add up to more than 100). Read by the ``lightning-zerocopy``
            command from the recipe before CUDA starts, as ``worker_sm_percent`` is.
        lookahead: three stages: the producer samples batch ``t + 2`` on a thread of its own while it gathers
            batch ``t + 1`` into a slot and the trainer trains on batch ``t``.
        green_context: in-process mode on a GPU: run the producer's kernels on CUDA green-context streams
            limited to ``worker_sm_percent`` % of the SMs, while training keeps the whole GPU (no daemon, no
            second process). Needs a PyTorch whose ``GreenContext`` has ``Stream()``; warns once and runs
            without the share otherwise. ``mode="auto"`` then means ``in_process``.
        timeout: seconds to wait for one batch from a live producer before raising; ``None`` (default): 20 times the
            slowest batch built so far, at least 60 s (600 s before the first batch), so a frozen worker is named
            within about a minute with its pid and state (:mod:`~lightning_zerocopy.pipeline.batch_timeout`).
        copy_stages: loaders whose batches are handed over as copies instead of views of their slot. Default
            ``("predict",)``: ``predict_step`` outputs are collected by Lightning and often contain batch fields
            (``batch.n_id``), which a view would let the next batch overwrite.

    A batch of the other loaders is a view of its slot and stays valid until the next batch of that loader is
    requested (after the step's backward): copy a field to keep it longer.

    The constructor only stores the configuration: the MPS daemon is joined (:meth:`join_mps`) and the producer
    started when the DataModule's ``setup`` attaches the callback; both are released at ``teardown``.

    Example::

        pipeline = PipelineCallback(mode="worker", mps=True, worker_sm_percent=10)
        trainer = pl.Trainer(accelerator="gpu", devices=1, callbacks=[pipeline])
        trainer.fit(model, datamodule=ZeroCopyDataModule(dataset))

    or in a recipe, ``trainer.callbacks: [{class_path: lightning_zerocopy.callbacks.PipelineCallback, init_args:
    {mode: worker, mps: true}}]``, run by the ``lightning-zerocopy`` command (it starts MPS before PyG loads).
    """

    #: A heterogeneous DataModule's builders are built here as the homogeneous ones are (their batches cross the
    #: slots flattened: :func:`lightning_zerocopy.pipeline.slots.flatten_hetero`).
    takes_hetero_builders = True

    def __init__(
        self,
        mode: Mode = "auto",
        depth: int = 2,
        mps: bool = False,
        worker_sm_percent: Union[int, Literal["auto"]] = DEFAULT_WORKER_SM_PERCENT,
        timeout: Optional[float] = None,
        copy_stages: Sequence[str] = ("predict",),
        lookahead: bool = True,
        green_context: bool = False,
        trainer_sm_percent: Optional[int] = None,
    ) -> None:
        check_pipeline_options(mode, depth, mps, worker_sm_percent, copy_stages, green_context, trainer_sm_percent)
        self.mode: Mode = mode
        self.depth = depth
        self.mps = mps
        self.worker_sm_percent = worker_sm_percent
        self.timeout = timeout
        self.copy_stages = tuple(copy_stages)
        self.lookahead = bool(lookahead)
        self.green_context = bool(green_context)
        self.trainer_sm_percent = trainer_sm_percent
        self.mps_daemon: Optional["MPSDaemon"] = None
        #: the client whose producer builds the batches now (``None`` outside a run)
        self.client: Optional["PipelineClient"] = None
        self._session: Optional[PipelineSession] = None  # the producers of the run being set up or run
        self._last_choice: Optional["ShareChoice"] = None  # the last calibrating session's choice (None: undecided)
        self._mps_checked = False
        self._numerics_checked: set[tuple] = set()  # (precision, trainer share, linear widths) found right
        self._datamodule: Any = None  # the DataModule using this session's loader factory

    # ---- set-up: called by the DataModule's setup, before the callbacks' ------------------------------------------
    def join_mps(self) -> Optional["MPSDaemon"]:
        """Join the MPS daemon this job's launcher started (``mps=True``; once, idempotent) and return it, or ``None``
        with a warning when it is too late to start one (:func:`~.pipeline.mps_launcher.join_for_trainer`). Called
        when the run is set up (the DataModule attaching the callback, ``setup``, :meth:`resolve_mode`)."""
        if self.mps and not self._mps_checked:
            self._mps_checked = True
            self.mps_daemon = mps_launcher.join_for_trainer(self._first_share, self.worker_sm_percent,
                                                            self.trainer_sm_percent)  # fmt: skip
        return self.mps_daemon

    @property
    def _first_share(self) -> int:
        """The worker's share at start (``"auto"``: the smallest of the ladder)."""
        return first_share(self.worker_sm_percent)

    def resolve_mode(self, device: torch.device, gpu_builder: bool = False) -> str:
        """The mode ``auto`` stands for on ``device``, for a DataModule whose batches are built on the GPU
        (``gpu_builder``: GPU/UVA sampling or the zero-copy gather) or on the CPU.

        With a running MPS daemon: the worker. Without MPS (not asked for, or unavailable): ``in_process`` for a
        GPU builder (a worker process outside MPS time-slices the GPU with the trainer), ``worker`` for a CPU
        builder (it keeps the trainer's interpreter free). On the CPU: ``in_process`` (a second process only
        competes for the same cores and costs a spawn). The figures behind this choice (``benchmarks/parts/pipeline.py``)
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
        PipelineSession.check_datamodule(datamodule)
        self._shutdown()
        self.join_mps()  # before the worker starts: it gets its share from the daemon's variables
        device = trainer.strategy.root_device
        self._check_share_numerics(trainer, device)
        mode = self.resolve_mode(device, gpu_builder=getattr(datamodule, "batch_device_type", "cpu") == "cuda")
        run = trainer.state.fn.value if trainer.state.fn is not None else "fit"
        try:
            self._session = PipelineSession.open(
                datamodule, run, mode, self.depth, device if device.type == "cuda" else torch.device("cpu"),
                self.worker_sm_percent, mps_daemon=self.mps_daemon, green_context=self.green_context,
                timeout=self.timeout, lookahead=self.lookahead, copy_stages=self.copy_stages,
            )  # fmt: skip
            self.client, self._datamodule = self._session.client, datamodule
            self._session.batch_limit = functools.partial(trainer_batch_limit, trainer)
            datamodule.use_loader_factory(self._session.loader)  # PipelineLoaders for the run's splits
        except BaseException:
            self._shutdown()
            raise

    def _check_share_numerics(self, trainer: "pl.Trainer", device: torch.device) -> None:
        """As an MPS client with a share of the SMs, this trainer's half-precision GEMMs must be right: on an H200 they
        were wrong at some shares (:mod:`~lightning_zerocopy.pipeline.share_numerics`), and training went on at
        chance with no error. Raises :class:`~.share_numerics.MPSShareNumericsError` before the worker starts."""
        percent = os.environ.get(mps.PERCENT_ENV)
        if self.mps_daemon is None or device.type != "cuda" or percent is None or int(percent) >= 100:
            return
        precision, module = str(trainer.precision), trainer.lightning_module
        checked = (precision, int(percent), tuple(linear_widths(module)) if module is not None else ())
        if checked in self._numerics_checked:  # fit, then test or predict in the same process: checked once
            return
        try:
            ensure_share_computes_right(device, precision, int(percent), self._first_share, module)
        except MPSShareNumericsError as exc:  # which shares would work, probed in processes of their own
            hint = suggest_shares(self.mps_daemon, int(percent), precision)
            raise MPSShareNumericsError(f"{exc} {hint}".strip()) from None
        self._numerics_checked.add(checked)

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
        if self._session is not None:
            self._session.step_started()

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._session is not None:
            self._session.step_ended()
            self.client = self._session.client

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._shutdown()

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        trace_a_slow_exit()
        run_failed(exception)  # first: an NCCL collective a peer never joins would hold the close's GPU waits
        self._shutdown(EXCEPTION_CLOSE_S)

    def _shutdown(self, timeout: float = 5.0) -> None:
        datamodule, self._datamodule = self._datamodule, None
        if datamodule is not None:
            datamodule.use_loader_factory(None)
        session, self._session, self.client = self._session, None, None
        if session is not None:
            if session.auto is not None:
                self._last_choice = session.share_choice
            session.close(timeout)

    # ---- what the run settled on -------------------------------------------------------------------------------
    @property
    def stats(self) -> Optional["PipelineStats"]:
        """Running figures of the producer (:class:`~lightning_zerocopy.pipeline.PipelineStats`), or None."""
        return self.client.stats if self.client is not None else None

    @property
    def share_choice(self) -> Optional["ShareChoice"]:
        """With ``worker_sm_percent="auto"``: the calibration's choice with its figures (share, build and step ms,
        whether it keeps pace), kept after ``teardown``; None before it decides, when the fit ended first, or for a
        share given as a number."""
        if self._session is not None and self._session.auto is not None:
            return self._session.share_choice
        return self._last_choice

    @property
    def chosen_worker_sm_percent(self) -> Optional[int]:
        """The worker's share of SMs this run settled on: ``worker_sm_percent`` when given as a number; with
        ``"auto"``, the share the calibration chose (:attr:`share_choice`), or None while it has not decided."""
        if self.worker_sm_percent != "auto":
            return int(self.worker_sm_percent)
        choice = self.share_choice
        return None if choice is None else choice.percent


def trainer_batch_limit(trainer: "pl.Trainer", split: str) -> Optional[int]:
    """The batches ``trainer`` takes of the training loader this epoch (``limit_train_batches``), or ``None`` for
    all of them and for the other splits (whose loops may also stop early, as the sanity check does: their
    producers build ahead and report as before)."""
    count = getattr(trainer, "num_training_batches", None) if split == "train" else None
    return count if isinstance(count, int) else None
