"""The candidate fixes of issue 39 as run settings: parsed from ``--knobs`` and applied inside a scaling run.

A knob variant is ``item[+item...]``, an item ``name`` (a switch, on) or ``name=value``; ``--knobs`` takes several
variants separated by commas, each one run (``benchmarks.scaling.diag``). The knobs and where they act:

* DDP (``DistributedDataParallel``'s own arguments, handed through ``ZeroCopyDDPStrategy(**kwargs)``):
  ``static_graph``, ``gradient_as_bucket_view``, ``bucket_cap_mb``, ``broadcast_buffers``;
* CPU threads of every process of the run (set before the launcher starts the other ranks, so ranks and pipeline
  workers inherit them): ``torch_threads`` (``OMP_NUM_THREADS`` and ``torch.set_num_threads``; unset, Lightning's
  launcher gives each rank ``cores // ranks``), ``interop_threads`` (``torch.set_num_interop_threads``);
  ``sampler_threads`` (the DataModule's ``num_threads``: the CPU sampler's threads);
* NCCL, read when a rank creates its communicator (environment variables set before the process group exists):
  ``nccl_max_channels`` / ``nccl_min_channels`` (``NCCL_MAX_NCHANNELS`` / ``NCCL_MIN_NCHANNELS``),
  ``nccl_max_ctas`` / ``nccl_min_ctas`` (``NCCL_MAX_CTAS`` / ``NCCL_MIN_CTAS``, their name since NCCL 2.17), and any
  variable as ``env.NAME=value`` (e.g. ``env.NCCL_ALGO=Ring``);
* the run: ``worker_sm_percent`` (the pipeline worker's MPS share), ``mps`` (the ranks as MPS clients with the
  trainer's share even without a worker), ``comm_timing`` (time every gradient bucket's all-reduce through a
  DDP comm hook: on by default in the diagnostic runs; ``comm_timing=0`` keeps DDP's built-in all-reduce),
  ``step_sigterm_broadcast=1`` (keep Lightning's per-step SIGTERM broadcast and its ``.item()``, which our runs skip
  by default since 2026-11-30, as the command does: :func:`lightning_zerocopy.preemption.skip_lightnings_step_broadcast`), ``compile`` (the homogeneous model's
  ``compile=True``).

Nothing here imports PyG or touches CUDA: :func:`apply_process_knobs` runs before the run starts MPS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["KNOBS", "apply_process_knobs", "ddp_kwargs", "parse_knobs", "parse_variants"]


@dataclass(frozen=True)
class Knob:
    """One knob: where it acts (``ddp``, ``env``, ``threads``, ``datamodule``, ``run``), its value type, the
    environment variable it sets (``env`` knobs) and a line of help."""

    where: str
    kind: Callable[[str], Any]
    help: str
    env: str = ""


def _switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"expected on/off (1/0, true/false), got {text!r}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


def _percent(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 99:
        raise ValueError(f"expected a share in [1, 99] %, got {text!r}")
    return value


KNOBS: dict[str, Knob] = {
    "static_graph": Knob("ddp", _switch, "DDP(static_graph=...): the reducer's bucket order fixed after the first step"),
    "gradient_as_bucket_view": Knob("ddp", _switch, "DDP(gradient_as_bucket_view=...): gradients are views of the "
                                    "buckets (no copy back after the all-reduce)"),
    "bucket_cap_mb": Knob("ddp", _positive_float, "DDP(bucket_cap_mb=...): MB of gradients per all-reduce bucket"),
    "broadcast_buffers": Knob("ddp", _switch, "DDP(broadcast_buffers=...): rank 0's buffers broadcast every forward"),
    "torch_threads": Knob("threads", _positive_int, "torch intra-op threads of every process (OMP_NUM_THREADS)"),
    "interop_threads": Knob("threads", _positive_int, "torch inter-op threads of every rank"),
    "sampler_threads": Knob("datamodule", _positive_int, "the DataModule's num_threads (CPU sampler threads)"),
    "nccl_max_channels": Knob("env", _positive_int, "NCCL_MAX_NCHANNELS", "NCCL_MAX_NCHANNELS"),
    "nccl_min_channels": Knob("env", _positive_int, "NCCL_MIN_NCHANNELS", "NCCL_MIN_NCHANNELS"),
    "nccl_max_ctas": Knob("env", _positive_int, "NCCL_MAX_CTAS", "NCCL_MAX_CTAS"),
    "nccl_min_ctas": Knob("env", _positive_int, "NCCL_MIN_CTAS", "NCCL_MIN_CTAS"),
    "worker_sm_percent": Knob("run", _percent, "the pipeline worker's MPS share (the trainer gets the rest)"),
    "mps": Knob("run", _switch, "ranks as MPS clients with the trainer's share, with or without a worker"),
    "comm_timing": Knob("run", _switch, "time each bucket's all-reduce through a DDP comm hook"),
    "sync_debug_steps": Knob("run", _positive_int, "data-phase steps whose synchronizing CUDA calls are counted by "
                             "caller (benchmarks.scaling.sync_finder)"),
    "profile_steps": Knob("run", _positive_int, "steps of each phase whose host time PyTorch's profiler sums by "
                          "operator and CUDA runtime call (benchmarks.scaling.host_profile)"),
    "gemm_rows": Knob("run", _positive_int, "GemmRowBuckets(multiple=N): the model's linear products on row counts "
                      "rounded up to N (cuBLAS's per-shape host setup, docs/PERFORMANCE.md)"),
    "compile": Knob("run", _switch, "GraphSAGE(compile=True): torch.compile the net (dynamic shapes), fewer kernel "
                    "launches a step: does a step less bound by its host forward wait less for the slower rank?"),
    "step_sigterm_broadcast": Knob("run", _switch, "Lightning's broadcast of its SIGTERM flag at the start of every "
                                   "step under several ranks (a device tensor and .item(): a host-device sync a step); "
                                   "off by default in our runs, as the lightning-zerocopy command skips it; on: kept "
                                   "(PyG's runs always keep it, as Lightning does)"),
}


def parse_knobs(spec: str) -> dict[str, Any]:
    """One variant ``item[+item...]`` as ``{"ddp": {...}, "env": {...}, "threads": {...}, "datamodule": {...},
    "run": {...}}`` (only the parts it sets).

    Raises:
        ValueError: an unknown knob (the message lists the known ones), a bad value, or a knob given twice.
    """
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for item in (part.strip() for part in spec.split("+")):
        if not item:
            continue
        name, has_value, text = item.partition("=")
        name = name.strip()
        if name in seen:
            raise ValueError(f"--knobs {spec!r}: {name} given twice")
        seen.add(name)
        if name.startswith("env."):
            if not has_value or not name[4:]:
                raise ValueError(f"--knobs {spec!r}: write an environment variable as env.NAME=value")
            out.setdefault("env", {})[name[4:]] = text
            continue
        knob = KNOBS.get(name)
        if knob is None:
            raise ValueError(f"--knobs {spec!r}: unknown knob {name!r}; known: {', '.join(KNOBS)}, env.NAME=value")
        try:
            value = knob.kind(text) if has_value else knob.kind("1")
        except ValueError as exc:
            raise ValueError(f"--knobs {spec!r}: {name}: {exc}") from None
        if knob.where == "env":
            out.setdefault("env", {})[knob.env] = str(value)
        else:
            out.setdefault(knob.where, {})[name] = value
    return out


def parse_variants(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``--knobs``: comma-separated variants as ``(label, parsed knobs)``, in order (raises as :func:`parse_knobs`)."""
    return [(v.strip(), parse_knobs(v)) for v in text.split(",") if v.strip()]


def apply_process_knobs(knobs: dict[str, Any]) -> None:
    """Set the environment variables and thread counts of ``knobs`` in this process (before the launcher starts the
    other ranks and before any process group exists: they inherit the environment)."""
    os.environ.update({str(k): str(v) for k, v in (knobs.get("env") or {}).items()})
    threads = knobs.get("threads") or {}
    if "torch_threads" in threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads["torch_threads"])  # Lightning's launcher then leaves it
        torch.set_num_threads(int(threads["torch_threads"]))
    if "interop_threads" in threads:
        import torch

        try:
            torch.set_num_interop_threads(int(threads["interop_threads"]))
        except RuntimeError:  # already started in this process: the ranks it launches still get it (each sets it)
            pass


def ddp_kwargs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The ``DistributedDataParallel`` arguments of ``knobs`` (for ``ZeroCopyDDPStrategy(**kwargs)``)."""
    return dict(knobs.get("ddp") or {})
