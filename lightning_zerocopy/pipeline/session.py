"""The producers one run of the trainer uses: started with the DataModule's sources, read through its loader factory.

:meth:`PipelineSession.open` starts a producer (:func:`~lightning_zerocopy.pipeline.start_pipeline`: a worker process
or a thread), registers one :class:`~lightning_zerocopy.pipeline.source.PlanSource` per stage of the run (the
DataModule's own ``plan(split)`` and ``builder(split)``), and gives :meth:`PipelineSession.loader`, the factory the
DataModule wraps its loaders with. With ``worker_sm_percent: auto`` it starts one worker per MPS share of the ladder
instead (:class:`~lightning_zerocopy.pipeline.share_auto.AutoShare`), fed with every training step's figures
(:meth:`PipelineSession.step_started` / :meth:`PipelineSession.step_ended`) until it has chosen a share.

What :class:`~lightning_zerocopy.callbacks.PipelineCallback` delegates to. Importing this module imports no PyG
(which initializes the CUDA driver): the sources and loaders are imported when a session opens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Sequence, Union

import torch

from lightning_zerocopy.options import check_depth
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.share_auto import AutoShare
from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER, ShareChoice

if TYPE_CHECKING:
    from lightning_zerocopy.pipeline.client import PipelineClient, PipelineStats
    from lightning_zerocopy.pipeline.mps import MPSDaemon

__all__ = ["STAGES_OF", "PipelineSession", "check_pipeline_options", "first_share"]

#: The loaders of each kind of run (Lightning's ``trainer.state.fn``).
STAGES_OF: dict[str, tuple[str, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
}


def check_pipeline_options(
    mode: str,
    depth: int,
    mps: bool,
    worker_sm_percent: Union[int, Literal["auto"]],
    copy_stages: Sequence[str],
    green_context: bool,
    trainer_sm_percent: Optional[int] = None,
) -> None:
    """Check :class:`~lightning_zerocopy.callbacks.PipelineCallback`'s arguments together.

    Raises:
        ValueError: naming the argument (``PipelineCallback(...=...)``) and what would work instead.
    """
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
    if trainer_sm_percent is not None:
        if isinstance(trainer_sm_percent, bool) or not isinstance(trainer_sm_percent, int) or not 1 <= trainer_sm_percent <= 100:
            raise ValueError(f"PipelineCallback(trainer_sm_percent=...) must be in [1, 100], got {trainer_sm_percent!r}")
        if not mps:
            raise ValueError("PipelineCallback(trainer_sm_percent=...) is the trainer's MPS share: set mps: true, or drop it")
    if mps and mode == "in_process":
        raise ValueError("PipelineCallback(mps=True) needs a worker process: use mode 'worker' or 'auto'")
    if green_context and (mps or mode == "worker"):
        raise ValueError(
            "PipelineCallback(green_context=True) shares SMs with an in-process producer: use mode 'in_process' "
            "or 'auto' without mps (a worker process gets its share from MPS)"
        )
    unknown = set(copy_stages) - {"train", "val", "test", "predict"}
    if unknown:
        raise ValueError(f"PipelineCallback(copy_stages=...) takes 'train', 'val', 'test', 'predict'; got {sorted(unknown)}")


def first_share(worker_sm_percent: Union[int, Literal["auto"]]) -> int:
    """The worker's share of the SMs at start (``"auto"``: the smallest of :data:`SHARE_LADDER`)."""
    return SHARE_LADDER[0] if worker_sm_percent == "auto" else int(worker_sm_percent)


class PipelineSession:
    """The producer(s) of one run and the stages they serve; see the module docstring (:meth:`open` starts them).

    Args:
        stages: the splits whose loaders the producer feeds.
        copy_stages: the splits whose batches are handed over as copies instead of views of their slot.
        client: the one producer's client, or
        auto: the producers of a share being chosen while training (:class:`AutoShare`, one worker per share).
    """

    def __init__(
        self,
        stages: Sequence[str],
        copy_stages: Sequence[str] = ("predict",),
        client: Optional["PipelineClient"] = None,
        auto: Optional[AutoShare] = None,
    ) -> None:
        if (client is None) == (auto is None):
            raise ValueError("a PipelineSession runs one client or one AutoShare")
        self.stages = tuple(stages)
        self.copy_stages = tuple(copy_stages)
        self.auto = auto
        #: the client whose producer builds the batches now
        self.client: Optional["PipelineClient"] = client if auto is None else auto.active
        #: the batches the loop takes of a split this epoch, when fewer than its loader's (set by the callback)
        self.batch_limit: Optional[Callable[[str], Optional[int]]] = None

    @staticmethod
    def check_datamodule(datamodule: Any) -> None:
        """Raise a ``TypeError`` unless ``datamodule`` has what a session uses: ``plan(split)``, ``builder(split)``
        and ``use_loader_factory(factory)``."""
        for name in ("plan", "builder", "use_loader_factory"):
            if not callable(getattr(datamodule, name, None)):
                raise TypeError(
                    f"PipelineCallback needs a DataModule with plan(split), builder(split) and use_loader_factory("
                    f"factory) (e.g. lightning_zerocopy.ZeroCopyDataModule); {type(datamodule).__name__} has no {name}()"
                )

    @classmethod
    def open(
        cls,
        datamodule: Any,
        run: str,
        mode: str,
        depth: int,
        device: torch.device,
        worker_sm_percent: Union[int, Literal["auto"]],
        mps_daemon: Optional["MPSDaemon"] = None,
        green_context: bool = False,
        timeout: Optional[float] = None,
        lookahead: bool = True,
        copy_stages: Sequence[str] = ("predict",),
    ) -> "PipelineSession":
        """Start the producer(s) of a run over ``datamodule``'s sources for the run's splits (:data:`STAGES_OF`).

        Args:
            datamodule: has ``plan(split)`` and ``builder(split)`` (a :class:`~lightning_zerocopy.ZeroCopyDataModule`,
                set up: its host memory can still be opened by name).
            run: Lightning's ``trainer.state.fn``: ``fit``, ``validate``, ``test`` or ``predict``.
            mode, depth, device, timeout, lookahead: as for :func:`~lightning_zerocopy.pipeline.start_pipeline`
                (``mode``: ``worker`` or ``in_process``; ``device``: where slots live).
            worker_sm_percent: the producer's share of the SMs: the worker's under ``mps_daemon``, the in-process
                producer's with ``green_context`` on a GPU; ``"auto"``: chosen while a fit trains (a worker under
                MPS on a GPU; elsewhere the ladder's first share).
            mps_daemon: the MPS daemon the worker joins (``None``: no MPS share).
            green_context: the in-process producer runs on green-context streams (a GPU only).
            copy_stages: as for :class:`PipelineSession`.
        """
        from lightning_zerocopy.pipeline.source import PlanSource  # imports PyG: not before a session opens

        stages = STAGES_OF.get(run, ())
        share = first_share(worker_sm_percent)
        green = share if green_context and device.type == "cuda" else None
        # auto calibrates on training steps: only a fit has them (other runs keep the ladder's first share)
        calibrate = (worker_sm_percent == "auto" and run == "fit" and mode == "worker" and mps_daemon is not None
                     and device.type == "cuda")  # fmt: skip

        def start(percent: Optional[int] = None, standby: bool = False) -> "PipelineClient":
            env = {} if mps_daemon is None else mps_daemon.client_env(share if percent is None else percent)
            client = start_pipeline(mode, depth, device, worker_env=env, timeout=timeout, lookahead=lookahead,
                                    green_context_percent=green)  # fmt: skip
            try:
                for stage in stages:
                    client.register(stage, PlanSource(datamodule.plan(stage), datamodule.builder(stage),
                                                      place_on_open=not standby))  # fmt: skip
            except BaseException:
                client.close()
                raise
            return client

        # every worker starts now, while the host memory's names exist (one started later could not map it)
        if calibrate:
            return cls(stages, copy_stages, auto=AutoShare(start, device))
        return cls(stages, copy_stages, client=start())

    def loader(self, split: str, loader: Any) -> Any:
        """The loader factory for the DataModule: ``loader`` as a
        :class:`~lightning_zerocopy.pipeline.loader.PipelineLoader` fed by the producer, for the splits of this run
        (others are returned as they are)."""
        if self.client is None or split not in self.stages:
            return loader
        from lightning_zerocopy.pipeline.loader import PipelineLoader

        current = (lambda: self.client) if self.auto is not None else None
        limit = (lambda: self.batch_limit(split)) if self.batch_limit is not None else None  # type: ignore[misc]
        return PipelineLoader(self.client, split, loader, copy=split in self.copy_stages, current=current, limit=limit)

    def step_started(self) -> None:
        """At a training batch's start (times the step while the share is being chosen)."""
        if self.auto is not None:
            self.auto.step_started()

    def step_ended(self) -> None:
        """At a training batch's end: the calibration gets the step's figures and may move the loaders to another
        worker between two batches."""
        if self.auto is not None and self.client is not None:
            self.auto.step_ended(self.client.stats.last_build_s)
            self.client = self.auto.active  # the loaders take their next batch from it

    @property
    def stats(self) -> Optional["PipelineStats"]:
        """Running figures of the active producer, or ``None`` once closed."""
        return None if self.client is None else self.client.stats

    @property
    def share_choice(self) -> Optional[ShareChoice]:
        """The calibration's choice of the worker's share (``None`` before it decides, or without calibration)."""
        return None if self.auto is None else self.auto.calibrator.choice

    def close(self, timeout: float = 5.0) -> None:
        """Stop every producer of the session (idempotent), each given ``timeout`` seconds before it is ended."""
        auto, self.auto = self.auto, None
        client, self.client = self.client, None
        if auto is not None:
            auto.close(timeout)  # every worker of the ladder, the active one included
        elif client is not None:
            client.close(timeout)
