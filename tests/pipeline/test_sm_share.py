"""The in-process producer's SM share (green contexts): errors and fallbacks on any machine, the share on a GPU."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from helpers.pipeline_fakes import FakeSource, TwoStageSource, matmul_tflops

from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.sm_share import GreenShare, SMShareUnavailable, SMShareWarning, sm_count_for


def test_sm_count_for_a_share():
    assert sm_count_for(10, 132) == 13
    assert sm_count_for(1, 16) == 1
    assert sm_count_for(99, 132) == 131
    with pytest.raises(ValueError, match=r"\[1, 99\]"):
        sm_count_for(0, 132)


def test_a_share_on_the_cpu_is_unavailable_and_the_pipeline_runs_without_it():
    with pytest.raises(SMShareUnavailable, match="CUDA device"):
        GreenShare(torch.device("cpu"), 10)
    with pytest.warns(SMShareWarning, match="without an SM share"):
        client = start_pipeline("in_process", depth=2, device="cpu", timeout=30, green_context_percent=10)
    src = TwoStageSource(steps=3, seed=4)
    client.register("t", src)
    try:
        got = [batch.n_id.clone() for batch in client.iterate("t", 0)]
        assert [torch.equal(a, src.reference(0, i).n_id) for i, a in enumerate(got)] == [True] * 3
    finally:
        client.close()


def test_a_share_is_for_the_in_process_producer_only():
    with pytest.raises(ValueError, match="mode='in_process'"):
        start_pipeline("worker", device="cpu", green_context_percent=10)
    with pytest.raises(ValueError, match="green_context=True"):
        PipelineCallback(mode="worker", green_context=True)
    with pytest.raises(ValueError, match="green_context=True"):
        PipelineCallback(mps=True, green_context=True)
    assert PipelineCallback(green_context=True).resolve_mode(torch.device("cuda", 0)) == "in_process"


def _tflops_on(make_stream) -> float:
    """matmul TFLOP/s on a stream made in a fresh thread (the thread-wide green-context API binds that thread)."""
    result: list[float] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            stream = make_stream()
            with torch.cuda.stream(stream):
                result.append(matmul_tflops(size=4096, iters=30))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.cuda
def test_green_share_confines_the_producers_kernels_or_reports_why_not():
    """Where PyTorch and the driver offer green contexts, a 10% share runs a compute-bound kernel well below the
    whole GPU's rate, and an in-process pipeline on it yields build_batch's batches; where they do not, the
    reason is named and the pipeline warns and runs without the share."""
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        share = GreenShare(device, 10)
    except SMShareUnavailable as exc:
        assert str(exc), "the reason must be named"
        with pytest.warns(SMShareWarning, match=re.escape(str(exc))):
            client = start_pipeline("in_process", device=device, timeout=60, green_context_percent=10)
        client.close()
        print(f"green contexts unavailable here: {exc}")
        return
    assert share.num_sms < share.device_sms
    full = _tflops_on(lambda: torch.cuda.Stream(device))
    confined = _tflops_on(share.stream)
    print(f"{share}: {confined:.1f} TFLOP/s on the share vs {full:.1f} on the whole GPU")
    assert confined < 0.35 * full, (confined, full)

    client = start_pipeline("in_process", depth=2, device=device, timeout=120, green_context_percent=10)
    src = FakeSource(steps=5, features=64, batch_size=256, seed=6, huge_at=2)
    client.register("t", src)
    try:
        for step, batch in enumerate(client.iterate("t", 0)):
            ref = src.build_batch(src.plan(0, step))
            assert batch.x.is_cuda and torch.equal(batch.x.cpu(), ref.x) and torch.equal(batch.n_id.cpu(), ref.n_id)
    finally:
        client.close()
