"""The half-precision GEMM check on a GPU: right on the whole GPU, and the default trainer share (the worker at
DEFAULT_WORKER_SM_PERCENT) right as an MPS client, checked by the probe command in a process of its own (a share is
fixed when a process creates its CUDA context)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lightning_zerocopy.pipeline.mps_launcher import DEFAULT_WORKER_SM_PERCENT
from lightning_zerocopy.pipeline.share_numerics import check_gemms

pytestmark = pytest.mark.cuda


def test_half_gemms_are_right_on_the_whole_gpu() -> None:
    checks = check_gemms(torch.device("cuda"), (torch.bfloat16, torch.float16))
    assert all(c.ok for c in checks), checks


@pytest.mark.slow
def test_the_default_trainer_share_computes_right_as_an_mps_client() -> None:
    trainer = 100 - DEFAULT_WORKER_SM_PERCENT
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_") and not k.startswith("LZC_MPS")}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_zerocopy.pipeline.share_numerics", "--trainer-percent", str(trainer),
         "--precision", "bf16-mixed"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"trainer {trainer} %" in done.stdout and "bfloat16 right" in done.stdout, done.stdout
