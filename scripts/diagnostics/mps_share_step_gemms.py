"""Which GEMM kernels the heavy training step runs, and how long the step takes, under one BLAS setting, in one process.

Call 68 (one H200, 2026-11-30, docs/gpu_checks/h200-2026-11-30e) found the heavy trainer, as an MPS client at 90 % of
the SMs, running one weight-gradient GEMM with a kernel twice as slow as the one it runs on the whole GPU (cuBLAS
chooses for the SM count it sees): 0.18 ms of a 5.9-ms step. This script asks which BLAS setting gets the fast kernel
back under a share (call 76, docs/gpu_checks/h200-2026-11-30f: none does; only an unlimited client runs it): it trains
the heavy GraphSAGE (PyG's, no package code) on the synthetic heavy batch (``benchmarks.common.heavy_batch``) in bf16
autocast, times ``--steps`` steps (a host timer between device syncs), profiles ``--profile-steps`` more, and prints
one JSON line: the SM count the process sees, the setting, the step's mean time, its kernels' time a step, and the
GEMM kernels (the most time first) with their mean time and count a step. ``--blas``: ``default``; ``cublas`` /
``cublaslt`` (``torch.backends.cuda.preferred_blas_library``); ``tunableop`` (``torch.cuda.tunable``: each GEMM shape
timed over its candidates once, the fastest kept). Run each setting in its own process, with and without a share (the
repository root on ``PYTHONPATH``)::

    python scripts/diagnostics/mps_share_step_gemms.py --blas default --tag whole
    python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent 10 -- \\
        python scripts/diagnostics/mps_share_step_gemms.py --blas default --tag share90
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from typing import Any, Iterable

import torch

from benchmarks.common.heavy_batch import CLASSES, FANOUTS, FEATURES, HIDDEN, heavy_batch, heavy_train_step

SETTINGS = ("default", "cublas", "cublaslt", "tunableop")
GEMM_MARKS = ("gemm", "nvjet", "cutlass", "splitK")


def apply_blas_setting(setting: str) -> None:
    """Set the process's BLAS choice before its first GEMM.

    Raises:
        ValueError: ``setting`` is not one of :data:`SETTINGS`.
    """
    if setting not in SETTINGS:
        raise ValueError(f"--blas {setting!r}: expected one of {', '.join(SETTINGS)}")
    if setting in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(setting)
    elif setting == "tunableop":
        import torch.cuda.tunable as tunable

        tunable.set_filename(os.path.join(tempfile.mkdtemp(prefix="tunableop-"), "results.csv"))
        tunable.enable(True)
        tunable.tuning_enable(True)


def gemm_rows(kernels: Iterable[tuple[str, float]], steps: int, top: int = 6) -> list[dict[str, Any]]:
    """``(name, microseconds)`` of every kernel a profile saw over ``steps`` steps -> the GEMM kernels by their time a
    step, the most first: name (cut to 100 characters), mean µs, launches a step."""
    spans: dict[str, list[float]] = defaultdict(list)
    for name, us in kernels:
        if any(mark in name for mark in GEMM_MARKS):
            spans[name].append(us)
    ranked = sorted(spans.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"kernel": n[:100], "mean_us": round(sum(d) / len(d), 1), "per_step": round(len(d) / steps, 2)}
            for n, d in ranked]  # fmt: skip


def measure(setting: str, tag: str, warmup: int, steps: int, profile_steps: int, device: str = "cuda") -> dict:
    """Train ``warmup`` steps, time ``steps``, profile ``profile_steps``; the JSON report (see the module's text)."""
    from torch.profiler import ProfilerActivity, profile
    from torch_geometric.nn.models import GraphSAGE

    apply_blas_setting(setting)
    dev = torch.device(device)
    torch.manual_seed(0)
    model = GraphSAGE(FEATURES, HIDDEN, len(FANOUTS), CLASSES, dropout=0.0).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = heavy_batch(0, dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        heavy_train_step(model, opt, batch, autocast)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        heavy_train_step(model, opt, batch, autocast)
    sync()
    step_ms = (time.perf_counter() - start) * 1e3 / max(steps, 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(profile_steps):
            heavy_train_step(model, opt, batch, autocast)
        sync()
    kernels = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type.name == "CUDA"]
    return {"tag": tag, "blas": setting, "mps_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "sm_count_seen": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
            "step_ms": round(step_ms, 3),
            "kernel_ms_per_step": round(sum(us for _, us in kernels) / 1e3 / max(profile_steps, 1), 3),
            "gemms": gemm_rows(kernels, max(profile_steps, 1))}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blas", default="default", choices=SETTINGS)
    parser.add_argument("--tag", default="whole")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.blas, args.tag, args.warmup, args.steps, args.profile_steps, args.device)),
          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
