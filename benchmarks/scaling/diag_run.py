"""The diagnostic parts of one scaling run's rank (``config["phases"]`` set; ``benchmarks.scaling.diag`` sets it):
the phased epochs and the ring of staged batches (:mod:`.phases`), the per-step timeline (:mod:`.timeline`), the
host's CPU figures (:mod:`benchmarks.common.host_load`), the barrier of independent runs (:mod:`.pair`), and this rank's report of
them; plus :func:`phase_rates`, each rank's steps per second in each phase from its epoch clock, and
:func:`phase_figures`, a run's throughput per phase over its ranks."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from benchmarks.common.host_load import HostLoad, thread_settings
from benchmarks.scaling.host_profile import HostProfile
from benchmarks.scaling.pair import EpochBarrier
from benchmarks.scaling.phases import RingPhases
from benchmarks.scaling.sync_finder import SyncFinder
from benchmarks.scaling.timeline import StepTimeline

__all__ = ["DiagRun", "phase_figures", "phase_rates"]


class DiagRun:
    """This rank's diagnostic callbacks and their report.

    Args:
        config: the run's configuration: ``phases`` (after the warm-up, each ``data`` or ``model``),
            ``ring_batches``, ``knobs`` (``run.comm_timing``, ``run.sync_debug_steps``, ``run.profile_steps``),
            ``barrier`` (independent runs: ``dir``, ``parties``) and ``slot``.
        cuda: the run trains on GPUs (CUDA events; NCCL).
        pipeline: the run's ``PipelineCallback`` (its client's wait for each batch), or ``None``.
    """

    def __init__(self, config: dict[str, Any], cuda: bool, pipeline: Optional[Any] = None) -> None:
        self.cuda = cuda
        run_knobs = (config.get("knobs") or {}).get("run") or {}
        self.env_knobs = sorted((config.get("knobs") or {}).get("env") or {})

        def handover() -> Optional[float]:
            stats = pipeline.stats if pipeline is not None else None
            return None if stats is None else float(stats.last_wait_s)

        self.phases = RingPhases(list(config["phases"]), int(config.get("ring_batches", 16)),
                                 handover if pipeline is not None else None)  # fmt: skip
        self.timeline = StepTimeline(self.phases.phase_of, cuda, bool(run_knobs.get("comm_timing", True)),
                                     self.phases.fetched)  # fmt: skip
        self.syncs = SyncFinder(self.phases.phase_of, int(run_knobs.get("sync_debug_steps", 0)) if cuda else 0)
        self.profile = HostProfile(self.phases.phase_of, int(run_knobs.get("profile_steps", 0)), skip=3)
        barrier = config.get("barrier")
        first_rank = int(config.get("slot", 0)) == 0 and not int(os.environ.get("LOCAL_RANK", "0") or 0)
        self.load = HostLoad(self.phases.phase_of, is_rank=lambda cmd: "--child" in cmd, include_mps=first_rank)
        self.barrier = EpochBarrier(barrier["dir"], barrier["parties"], config["slot"]) if barrier else None

    @property
    def epochs(self) -> int:
        return self.phases.epochs

    def first_callbacks(self) -> list[Any]:
        """Before the epoch clock (the independent runs' barrier, so that the clocks start after it; the host
        figures' opening reading, so that it stays out of the timed epoch)."""
        return ([self.barrier] if self.barrier is not None else []) + [self.load]

    def after_clock(self) -> list[Any]:
        """Right after the epoch clock (the host figures' closing reading)."""
        return [self.load.closer()]

    def last_callbacks(self) -> list[Any]:
        """After the ``PipelineCallback`` (its loader factory is the one the phases wrap)."""
        return [self.phases, self.timeline] + [c for c in (self.syncs, self.profile) if c.steps]

    def report(self, sampler_threads: Optional[int]) -> dict[str, Any]:
        """The rank's diagnostic figures (the JSON's ``per_rank[i].diag``)."""
        gpu: dict[str, Any] = {}
        if self.cuda and torch.cuda.is_available():
            device = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(device)
            gpu = {"name": props.name, "index": device, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "pci_bus_id": getattr(props, "pci_bus_id", None), "sm_count": props.multi_processor_count}  # fmt: skip
            try:
                gpu["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001 - a build without NCCL
                gpu["nccl_version"] = None
        return {
            "phases_by_epoch": [self.phases.phase_of(e) for e in range(self.epochs)],
            "timeline": self.timeline.summary(),
            "host_load": self.load.phases,
            "syncs": self.syncs.summary() if self.syncs.steps else None,
            "host_profile": self.profile.summary() if self.profile.steps else None,
            "threads": thread_settings(sampler_threads),
            "env": {name: os.environ.get(name) for name in self.env_knobs},  # the knobs' variables as the rank saw them
            "mps_client": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
            "trainer_sm_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "ring_batches": len(self.phases.ring),
            "barrier_timeouts": self.barrier.timeouts if self.barrier is not None else [],
            "gpu": gpu,
        }


def phase_rates(rank: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per measured phase of one rank's report: ``steps``, ``seconds`` and ``steps_per_s`` (its epochs' steps over
    their seconds, the device synchronized at both ends of each)."""
    phases = (rank.get("diag") or {}).get("phases_by_epoch") or []
    out: dict[str, dict[str, float]] = {}
    for phase, seconds, steps in zip(phases, rank.get("epoch_s") or [], rank.get("epoch_steps") or []):
        if phase == "warmup":
            continue
        entry = out.setdefault(phase, {"steps": 0, "seconds": 0.0})
        entry["steps"] += steps
        entry["seconds"] += seconds
    for entry in out.values():
        entry["steps_per_s"] = entry["steps"] / entry["seconds"] if entry["seconds"] > 0 else 0.0
    return out


def phase_figures(ranks: list[dict[str, Any]], phases: list[str]) -> dict[str, Any]:
    """A phased run's throughput: per phase each rank's steps/s and the seeds/s of all ranks (each rank's batch size
    times its own rate: independent runs do not keep step); the first phase's figures also at the top level."""
    rates = [phase_rates(r) for r in ranks]
    batch = int(ranks[0]["batch_size"])
    out: dict[str, Any] = {}
    for phase in dict.fromkeys(phases):
        per_rank = [rate.get(phase, {}).get("steps_per_s", 0.0) for rate in rates]
        out[phase] = {"rank_steps_per_s": per_rank, "steps": [rate.get(phase, {}).get("steps", 0) for rate in rates],
                      "seconds": [rate.get(phase, {}).get("seconds", 0.0) for rate in rates],
                      "seeds_per_s": batch * sum(per_rank)}  # fmt: skip
    first = out[phases[0]]
    return {"phases": out, "batch_size": batch, "seeds_per_s": first["seeds_per_s"],
            "rank_steps_per_s": sum(first["rank_steps_per_s"]) / len(ranks), "measured_steps": sum(first["steps"])}  # fmt: skip
