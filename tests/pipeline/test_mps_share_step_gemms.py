"""``scripts/diagnostics/mps_share_step_gemms.py``: the heavy step's GEMM kernels and time under one BLAS setting."""

from __future__ import annotations

import json

import pytest
from helpers import load_diagnostic


def test_the_gemm_kernels_are_ranked_by_their_time_a_step_and_the_rest_left_out():
    rows = load_diagnostic("mps_share_step_gemms").gemm_rows(
        [("cutlass_80_gemm_256x128_nt", 185.0), ("cutlass_80_gemm_256x128_nt", 187.0), ("nvjet_sm90_splitK", 29.0),
         ("vectorized_elementwise_kernel", 500.0), ("nvjet_sm90_splitK", 31.0), ("nvjet_sm90_splitK", 30.0)],
        steps=2,
    )  # fmt: skip
    assert rows == [{"kernel": "cutlass_80_gemm_256x128_nt", "mean_us": 186.0, "per_step": 1.0},
                    {"kernel": "nvjet_sm90_splitK", "mean_us": 30.0, "per_step": 1.5}]  # fmt: skip


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match="--blas 'cudnn': expected one of default, cublas, cublaslt, tunableop"):
        load_diagnostic("mps_share_step_gemms").apply_blas_setting("cudnn")


def test_one_cpu_run_reports_its_step_time_and_no_gpu_kernels(capsys):
    load_diagnostic("mps_share_step_gemms").main(
        ["--device", "cpu", "--warmup", "0", "--steps", "1", "--profile-steps", "1", "--tag", "cpu"]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["tag"] == "cpu" and report["blas"] == "default" and report["sm_count_seen"] is None
    assert report["step_ms"] > 0 and report["kernel_ms_per_step"] == 0 and report["gemms"] == []
