"""The trainer's check of its half-precision GEMMs at an MPS share (lightning_zerocopy.pipeline.share_numerics), and
PipelineCallback running it before the worker starts. The GEMMs themselves run on the CPU here; the GPU case is
tests/pipeline/test_share_numerics_cuda.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.callbacks import pipeline as callback_module
from lightning_zerocopy.pipeline import mps
from lightning_zerocopy.pipeline.share_numerics import (
    MPSShareNumericsError,
    check_gemms,
    ensure_share_computes_right,
    gemm_dtypes,
    linear_widths,
)

CPU = torch.device("cpu")
ROWS = (64, 300)


def wrong_in_half(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """A GEMM as the H200's were at a bad share: right in fp32, its first rows garbage in half precision."""
    out = F.linear(a, w, b)
    if a.dtype in (torch.bfloat16, torch.float16):
        out = out.clone()
        out[: out.shape[0] // 2] *= -3
    return out


def nan_rows(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    out = F.linear(a, w, b).clone()
    out[0, 0] = float("nan")
    return out


def test_right_gemms_pass_in_every_half_dtype() -> None:
    checks = check_gemms(CPU, (torch.bfloat16, torch.float16), rows=ROWS)
    assert [c.dtype for c in checks] == [torch.bfloat16, torch.float16]
    assert all(c.ok for c in checks), checks
    assert all(0 < c.worst_rel_err < 0.01 for c in checks)


def test_wrong_gemms_are_named_with_shape_and_error() -> None:
    (check,) = check_gemms(CPU, (torch.bfloat16,), widths=((256, 256),), rows=ROWS, linear=wrong_in_half)
    assert not check.ok
    assert check.worst_rel_err > 1
    assert "64x256 @ 256x256 + bias" in " ".join(check.failures)
    assert len(check.failures) == len(ROWS) * 2


def test_nan_counts_as_wrong() -> None:
    (check,) = check_gemms(CPU, (torch.bfloat16,), widths=((128, 128),), rows=(64,), linear=nan_rows)
    assert not check.ok and math.isinf(check.worst_rel_err)


@pytest.mark.parametrize(
    "precision, expected",
    [("bf16-mixed", (torch.bfloat16,)), ("bf16-true", (torch.bfloat16,)), ("16-mixed", (torch.float16,)),
     ("16-true", (torch.float16,)), ("32-true", ()), ("64-true", ())],
)  # fmt: skip
def test_gemm_dtypes_follow_the_precision(precision: str, expected: tuple) -> None:
    assert gemm_dtypes(precision) == expected


def test_fp32_on_tf32_tensor_cores_is_checked() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert gemm_dtypes("32-true") == (torch.float32,)
    finally:
        torch.set_float32_matmul_precision(before)


def test_linear_widths_are_the_modules_initialized_layers() -> None:
    from torch_geometric.nn import Linear as PyGLinear

    module = nn.Sequential(nn.Linear(100, 256), nn.ReLU(), PyGLinear(256, 47), PyGLinear(-1, 8), nn.Embedding(1000, 16))
    assert linear_widths(module) == [(100, 256), (256, 47)]  # widest first


def test_a_wrong_share_raises_naming_what_to_change() -> None:
    with pytest.raises(MPSShareNumericsError) as info:
        ensure_share_computes_right(CPU, "bf16-mixed", 80, 20, nn.Linear(100, 64), linear=wrong_in_half, rows=ROWS)
    message = str(info.value)
    for part in ("80 % of the SMs", "worker's share is 20 %", "bfloat16", "64x256 @ 256x256", "worker_sm_percent",
                 "python -m lightning_zerocopy.pipeline.share_numerics", "trainer_sm_percent to 100", "'32-true'",
                 "mps: false"):  # fmt: skip
        assert part in message, (part, message)


def test_a_right_share_and_fp32_training_pass() -> None:
    assert all(c.ok for c in ensure_share_computes_right(CPU, "bf16-mixed", 90, 10, rows=ROWS))
    assert ensure_share_computes_right(CPU, "32-true", 80, 20, linear=wrong_in_half, rows=ROWS) == []


class _Trainer(SimpleNamespace):
    pass


@pytest.mark.parametrize(
    "daemon, percent, device, runs",
    [(True, "80", "cuda", True), (True, "90", "cuda", True), (False, "80", "cuda", False), (True, None, "cuda", False),
     (True, "100", "cuda", False), (True, "80", "cpu", False)],
)  # fmt: skip
def test_the_callback_checks_its_share_only_as_an_mps_client(monkeypatch, daemon, percent, device, runs) -> None:
    calls = []
    monkeypatch.setattr(callback_module, "ensure_share_computes_right", lambda *args: calls.append(args))
    if percent is None:
        monkeypatch.delenv(mps.PERCENT_ENV, raising=False)
    else:
        monkeypatch.setenv(mps.PERCENT_ENV, percent)
    callback = PipelineCallback(mps=True, worker_sm_percent=100 - int(percent or 90) if percent != "100" else 10)
    callback.mps_daemon = object() if daemon else None
    module = nn.Linear(4, 4)
    callback._check_share_numerics(_Trainer(precision="bf16-mixed", lightning_module=module), torch.device(device))
    if runs:
        assert calls == [(torch.device(device), "bf16-mixed", int(percent), 100 - int(percent), module)]
    else:
        assert calls == []


def _row(percent: int, ok: bool) -> dict:
    return {"percent": str(percent), "sm_count": 132 * percent // 100,
            "checks": {"bfloat16": {"ok": ok, "worst_rel_err": 0.002 if ok else 0.8, "failures": []}}}  # fmt: skip


def test_the_hint_names_the_shares_probed_right(monkeypatch) -> None:
    from lightning_zerocopy.pipeline import share_numerics

    asked = []

    def probe(percents, precision, timeout, daemon):
        asked.append((list(percents), precision, daemon))
        return [_row(p, p in (90, 50)) for p in percents]

    monkeypatch.setattr(share_numerics, "probe_shares", probe)
    hint = share_numerics.suggest_shares("daemon", 80, "bf16-mixed")
    assert asked == [([90, 70, 60, 50], "bf16-mixed", "daemon")]  # the failing share is not probed again
    assert hint == ("Probed just now on this GPU: the trainer computes right at 90, 50 % (worker_sm_percent 10, 50), "
                    "wrong at 70, 60 %.")  # fmt: skip
    monkeypatch.setattr(share_numerics, "probe_shares", lambda p, *a, **k: [_row(x, False) for x in p])
    assert "computes wrong too" in share_numerics.suggest_shares("daemon", 90, "bf16-mixed")

    def broken(*args, **kwargs):
        raise OSError("no python")

    monkeypatch.setattr(share_numerics, "probe_shares", broken)
    assert share_numerics.suggest_shares("daemon", 80, "bf16-mixed") == ""  # the error still goes out, without a hint


def test_right_shares_need_every_dtype_right_and_an_answer() -> None:
    from lightning_zerocopy.pipeline.share_numerics import right_shares

    mixed = _row(70, True)
    mixed["checks"]["float16"] = {"ok": False, "worst_rel_err": 9.0, "failures": ["x"]}
    assert right_shares([_row(90, True), _row(80, False), mixed, {"percent": "60", "error": "killed"}]) == [90]


def test_the_callbacks_error_carries_the_probed_hint(monkeypatch) -> None:
    def wrong(*args):
        raise MPSShareNumericsError("wrong GEMMs at 80 %.")

    monkeypatch.setattr(callback_module, "ensure_share_computes_right", wrong)
    monkeypatch.setattr(callback_module, "suggest_shares", lambda daemon, percent, precision: f"hint {percent} {precision}")
    monkeypatch.setenv(mps.PERCENT_ENV, "80")
    callback = PipelineCallback(mps=True, worker_sm_percent=20)
    callback.mps_daemon = object()
    trainer = _Trainer(precision="bf16-mixed", lightning_module=nn.Linear(4, 4))
    with pytest.raises(MPSShareNumericsError, match=r"^wrong GEMMs at 80 %\. hint 80 bf16-mixed$"):
        callback._check_share_numerics(trainer, torch.device("cuda"))


def test_the_callback_checks_a_share_once_per_precision_and_module(monkeypatch) -> None:
    """fit, then test and predict in the same process: the same share, precision and widths are checked once."""
    calls = []
    monkeypatch.setattr(callback_module, "ensure_share_computes_right", lambda *args: calls.append(args[1]))
    monkeypatch.setenv(mps.PERCENT_ENV, "90")
    callback = PipelineCallback(mps=True, worker_sm_percent=10)
    callback.mps_daemon = object()
    module = nn.Linear(4, 4)
    for precision in ("bf16-mixed", "bf16-mixed", "16-mixed", "bf16-mixed"):
        callback._check_share_numerics(_Trainer(precision=precision, lightning_module=module), torch.device("cuda"))
    callback._check_share_numerics(_Trainer(precision="bf16-mixed", lightning_module=nn.Linear(4, 8)),
                                   torch.device("cuda"))  # fmt: skip
    assert calls == ["bf16-mixed", "16-mixed", "bf16-mixed"]
