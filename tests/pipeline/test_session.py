"""PipelineSession on the CPU with fake clients: one client or one AutoShare, loaders only for the run's splits, the
calibration moving the loaders to another worker between two steps, everything closed once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.pipeline import share_auto
from lightning_zerocopy.pipeline.session import PipelineSession, check_pipeline_options, first_share
from lightning_zerocopy.pipeline.share_auto import AutoShare
from lightning_zerocopy.pipeline.share_choice import ShareCalibrator


class _Client:
    def __init__(self, percent: int = 10, standby: bool = False) -> None:
        self.percent, self.standby, self.closed = percent, standby, False
        self.stats = SimpleNamespace(last_build_s=0.0)

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def test_a_session_runs_one_client_or_one_autoshare() -> None:
    with pytest.raises(ValueError, match="one client or one AutoShare"):
        PipelineSession(("train",))
    client = _Client()
    session = PipelineSession(("train", "val"), client=client)  # type: ignore[arg-type]
    assert session.client is client and session.share_choice is None and session.stats is client.stats
    loader = object()
    assert session.loader("test", loader) is loader  # not a split of this run
    session.close()
    assert client.closed and session.client is None and session.stats is None
    session.close()  # idempotent
    assert session.loader("train", loader) is loader  # closed: the DataModule's own loader


def test_step_ended_moves_the_loaders_to_the_calibrations_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(share_auto, "rank_zero_info", lambda message: None)
    started: list[_Client] = []
    auto = AutoShare(lambda p, s: started.append(_Client(p, s)) or started[-1], torch.device("cpu"),
                     ShareCalibrator(warmup=1, steps=3))  # fmt: skip
    session = PipelineSession(("train",), auto=auto)
    assert session.client is started[0] and [c.standby for c in started] == [False, True, True]
    for _ in range(4):  # 10 %: a 50 ms build does not fit in a 4 ms step
        auto.calibrator.record(50.0, 4.0)
    session.step_ended()  # no CUDA step was timed on the CPU: the calibration's state decides alone
    assert session.client is started[1] and session.client.percent == 20
    session.close()
    assert all(c.closed for c in started) and session.auto is None


def test_options_are_checked_together_and_auto_starts_at_the_smallest_share() -> None:
    check_pipeline_options("worker", 2, True, "auto", ("predict",), False)
    with pytest.raises(ValueError, match="needs a worker process"):
        check_pipeline_options("in_process", 2, True, 10, (), False)
    with pytest.raises(ValueError, match="copy_stages"):
        check_pipeline_options("auto", 2, False, 10, ("training",), False)
    assert first_share("auto") == 10 and first_share(25) == 25


def test_the_trainers_share_is_checked_with_the_others() -> None:
    check_pipeline_options("worker", 2, True, 20, (), False, trainer_sm_percent=100)
    for bad in (0, 101, True, "90"):
        with pytest.raises(ValueError, match=r"trainer_sm_percent=...\) must be in \[1, 100\]"):
            check_pipeline_options("worker", 2, True, 20, (), False, trainer_sm_percent=bad)
    with pytest.raises(ValueError, match="trainer's MPS share: set mps: true"):
        check_pipeline_options("worker", 2, False, 20, (), False, trainer_sm_percent=100)
