"""Does this process, an MPS client with a share of the SMs, get right answers from cuBLAS's half-precision GEMMs?

Measured on one H200 (driver 580.159.04, torch 2.11 + CUDA 13.0, 2026-11-29, ``scripts/diagnostics/mps_share_gemm.py``):
as an MPS client limited to 52, 78, 92, 98, 102, 104, 106, 108 or 112 of its 132 SMs, bf16 and fp16 GEMMs of a
256-wide ``Linear`` come back wrong (relative error 0.3 to 111 against fp32, some NaN); the kernels that do it are
cuBLAS's Hopper kernels with 8-block thread-block clusters. At 12, 26, 38, 66, 118, 124 SMs and on the whole GPU the
same GEMMs are right, and fp32 ones are right at every share. The heavy GraphSAGE with the trainer at 80 % (the worker
at 20 %) trained at chance, with no error anywhere. Which SM counts are affected depends on the GPU, the driver and
cuBLAS, so the trainer checks its own share when it joins the daemon (:func:`ensure_share_computes_right`, called by
:class:`~lightning_zerocopy.callbacks.PipelineCallback`), and ``python -m lightning_zerocopy.pipeline.share_numerics``
tells which trainer shares compute right on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "GemmCheck",
    "MPSShareNumericsError",
    "check_gemms",
    "ensure_share_computes_right",
    "gemm_dtypes",
    "linear_widths",
    "probe_shares",
    "right_shares",
    "suggest_shares",
]

#: Rows of the checked GEMMs: a seed batch, a 2-hop frontier, a 3-hop one (the heavy model's layer sizes).
CHECK_ROWS = (1024, 13312, 111616)
#: (in, out) widths always checked besides the module's own: the failing ones measured on the H200.
CHECK_WIDTHS = ((256, 256), (128, 128))
#: Relative error (Frobenius, against fp64 on the same rounded inputs) above which a GEMM is wrong; a right bf16 one is
#: ~0.002 at these sizes, the wrong ones measured 0.3 and more.
TOLERANCE = 0.02


class MPSShareNumericsError(RuntimeError):
    """Half-precision GEMMs give wrong results in this process at its MPS share of the SMs."""


@dataclass(frozen=True)
class GemmCheck:
    """One dtype's GEMMs against fp32: the worst relative error and the cases past the tolerance."""

    dtype: torch.dtype
    worst_rel_err: float
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures


def gemm_dtypes(precision: str) -> tuple[torch.dtype, ...]:
    """The GEMM dtypes a Lightning ``precision`` setting runs: bf16 for ``bf16-*``, fp16 for ``16-*``; for fp32 and
    fp64 none (fp32 GEMMs were right at every share), unless ``torch.set_float32_matmul_precision`` lets fp32 GEMMs
    run on TF32 tensor cores."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return (torch.bfloat16,)
    if precision.startswith("16") or precision == "transformer-engine-float16":
        return (torch.float16,)
    if precision.startswith("transformer-engine"):
        return (torch.bfloat16,)
    return (torch.float32,) if torch.get_float32_matmul_precision() != "highest" else ()


def linear_widths(module: torch.nn.Module, limit: int = 6) -> list[tuple[int, int]]:
    """The distinct (in, out) widths of ``module``'s initialized linear layers (``torch.nn.Linear`` and PyG's
    ``Linear``), at most ``limit``, widest first."""
    from torch_geometric.nn import Linear as PyGLinear  # here, not at import: PyG initializes CUDA when imported

    widths = set()
    for sub in module.modules():
        weight = getattr(sub, "weight", None)
        uninitialized = isinstance(weight, torch.nn.parameter.UninitializedParameter)  # PyG's lazy in_channels=-1
        if not isinstance(sub, (torch.nn.Linear, PyGLinear)) or uninitialized:
            continue
        widths.add((int(weight.shape[1]), int(weight.shape[0])))
    return sorted(widths, key=lambda w: -w[0] * w[1])[:limit]


def check_gemms(
    device: torch.device,
    dtypes: Sequence[torch.dtype],
    widths: Iterable[tuple[int, int]] = CHECK_WIDTHS,
    rows: Sequence[int] = CHECK_ROWS,
    linear: Callable[..., torch.Tensor] = F.linear,
    tolerance: float = TOLERANCE,
) -> list[GemmCheck]:
    """``linear`` in each dtype, with and without a bias, against fp64 on the same rounded inputs, on ``device``.
    A NaN or infinite result counts as wrong. Deterministic inputs (a fixed seed on the CPU)."""
    widths = list(dict.fromkeys(widths))
    gen = torch.Generator().manual_seed(0)
    checks = []
    for dtype in dtypes:
        worst, failures = 0.0, []
        for m in rows:
            for k, n in widths:
                a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
                w = (torch.randn(n, k, generator=gen) / math.sqrt(k)).to(device=device, dtype=dtype)
                b = torch.randn(n, generator=gen).to(device=device, dtype=dtype)
                for bias in (None, b):
                    ref = F.linear(a.double(), w.double(), None if bias is None else bias.double())
                    out = linear(a, w, bias).double()
                    err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
                    if not math.isfinite(err) or err > tolerance:
                        failures.append(f"{m}x{k} @ {k}x{n}{' + bias' if bias is not None else ''}: {err:.3g}")
                    worst = max(worst, err) if math.isfinite(err) else math.inf
        checks.append(GemmCheck(dtype, worst, tuple(failures)))
    return checks


def ensure_share_computes_right(
    device: torch.device,
    precision: str,
    trainer_percent: int,
    worker_percent: Optional[int] = None,
    module: Optional[torch.nn.Module] = None,
    linear: Callable[..., torch.Tensor] = F.linear,
    rows: Sequence[int] = CHECK_ROWS,
) -> list[GemmCheck]:
    """Raise :class:`MPSShareNumericsError` when this process, an MPS client at ``trainer_percent`` % of the SMs,
    gets wrong half-precision GEMMs for ``precision`` (the widths checked: :data:`CHECK_WIDTHS` and ``module``'s own
    linear layers). Returns the checks (none for a precision without reduced-precision GEMMs)."""
    dtypes = gemm_dtypes(precision)
    if not dtypes:
        return []
    widths = list(CHECK_WIDTHS) + (linear_widths(module) if module is not None else [])
    checks = check_gemms(device, dtypes, widths, rows, linear=linear)
    bad = [c for c in checks if not c.ok]
    if bad:
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else "?"
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        cases = "; ".join(f"{str(c.dtype)[6:]}: {', '.join(c.failures[:3])}" for c in bad)
        worker = f"; the worker's share is {worker_percent} %" if worker_percent is not None else ""
        raise MPSShareNumericsError(
            f"this trainer is an MPS client at {trainer_percent} % of the SMs ({sms} SMs of the {name}{worker}), and "
            f"cuBLAS's {', '.join(str(c.dtype)[6:] for c in bad)} GEMMs come back wrong there (relative error against "
            f"fp64: {cases}); training at precision {precision!r} would go on without an error and learn nothing. "
            "Change one of: PipelineCallback's worker_sm_percent (see which trainer shares compute right on this GPU "
            "with `python -m lightning_zerocopy.pipeline.share_numerics`; 10 % was right on an H200), its "
            "trainer_sm_percent to 100 (the trainer unlimited, slower where measured), the trainer's precision to "
            "'32-true', or mps: false."
        )
    return checks


def _child(precision: str) -> None:
    """One share's check in this process (an MPS client already): one JSON line."""
    device = torch.device("cuda")
    checks = check_gemms(device, gemm_dtypes(precision) or (torch.bfloat16, torch.float16))
    print(json.dumps({
        "percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "sm_count": torch.cuda.get_device_properties(device).multi_processor_count,
        "checks": {str(c.dtype)[6:]: {"ok": c.ok, "worst_rel_err": c.worst_rel_err, "failures": list(c.failures)}
                   for c in checks},
    }), flush=True)  # fmt: skip


def probe_shares(percents: Sequence[int], precision: str, timeout: float = 120.0, daemon: Any = None) -> list[dict]:
    """Each trainer share's check in a process of its own, an MPS client of ``daemon`` (default: one started here and
    stopped after, so this process must not have initialized CUDA). Rows: the share, the SMs it gets, per dtype right
    or not (``error`` instead when the process gave no answer)."""
    from lightning_zerocopy.pipeline import mps

    own = daemon is None
    if own:
        daemon = mps.start_mps()
        if daemon is None:
            raise RuntimeError("no MPS daemon could be started here (see the warning above): nothing to probe")
    rows = []
    try:
        for percent in percents:
            env = {**os.environ, **daemon.client_env(percent)}
            cmd = [sys.executable, "-m", "lightning_zerocopy.pipeline.share_numerics", "--child", "--precision", precision]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            rows.append(json.loads(lines[-1]) if lines else {"percent": str(percent), "error": done.stderr[-2000:]})
    finally:
        if own:
            daemon.stop()
    return rows


def right_shares(rows: Sequence[dict]) -> list[int]:
    """The probed trainer shares whose every dtype computed right."""
    return [int(r["percent"]) for r in rows if "checks" in r and all(c["ok"] for c in r["checks"].values())]


def suggest_shares(daemon: Any, wrong_percent: int, precision: str, candidates: Sequence[int] = (90, 80, 70, 60, 50),
                   timeout: float = 60.0) -> str:  # fmt: skip
    """A sentence for the error: which other trainer shares compute right on this GPU, probed now (one process each,
    clients of this job's ``daemon``); empty when the probe itself fails."""
    shares = [p for p in candidates if p != wrong_percent][:4]
    try:
        rows = probe_shares(shares, precision, timeout, daemon=daemon)
    except Exception:  # noqa: BLE001 - the error being raised matters more than this hint
        return ""
    right = right_shares(rows)
    wrong = [p for p in shares if p not in right]
    if not right:
        return f"Probed just now on this GPU: the trainer at {', '.join(map(str, shares))} % computes wrong too."
    return (f"Probed just now on this GPU: the trainer computes right at {', '.join(map(str, right))} % "
            f"(worker_sm_percent {', '.join(str(100 - p) for p in right)})"
            + (f", wrong at {', '.join(map(str, wrong))} %." if wrong else "."))  # fmt: skip


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Which trainer shares of the SMs (MPS clients) get right half-precision GEMMs on this GPU.")
    parser.add_argument("--trainer-percent", default="90,80,70,60,50",
                        help="comma-separated trainer shares (the worker's is 100 minus it)")
    parser.add_argument("--precision", default="bf16-mixed", help="Lightning precision whose GEMM dtype to check")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.precision)
        return 0
    rows = probe_shares([int(p) for p in args.trainer_percent.split(",")], args.precision)
    bad = 0
    for row in rows:
        if "error" in row:
            print(f"trainer {row['percent']} %: the check failed to run:\n{row['error']}")
            bad += 1
            continue
        verdicts = ", ".join(f"{d} {'right' if c['ok'] else 'WRONG (worst rel err %.3g)' % c['worst_rel_err']}"
                             for d, c in row["checks"].items())  # fmt: skip
        bad += not all(c["ok"] for c in row["checks"].values())
        print(f"trainer {row['percent']} % ({row['sm_count']} SMs), worker {100 - int(row['percent'])} %: {verdicts}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
