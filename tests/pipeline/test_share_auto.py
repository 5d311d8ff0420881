"""AutoShare on the CPU: a run that ends before the calibration decides still says what it measured; the
callback tells which share its session's calibration chose, also after teardown."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.pipeline import share_auto
from lightning_zerocopy.pipeline.session import PipelineSession
from lightning_zerocopy.pipeline.share_auto import AutoShare
from lightning_zerocopy.pipeline.share_choice import ShareCalibrator


class _Client:
    def __init__(self, percent: int, standby: bool) -> None:
        self.percent, self.standby, self.closed = percent, standby, False

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def test_closing_before_the_calibration_decides_says_so_and_closes_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(share_auto, "rank_zero_info", said.append)
    started: list[_Client] = []

    def start(percent: int, standby: bool) -> _Client:
        started.append(_Client(percent, standby))
        return started[-1]

    auto = AutoShare(start, torch.device("cpu"), ShareCalibrator(warmup=1, steps=3))
    assert [c.standby for c in started] == [False, True, True]
    auto.close()
    assert all(c.closed for c in started)
    assert len(said) == 1 and "did not finish" in said[0] and "up to 12 training steps" in said[0]


def test_the_chosen_share_stays_readable_after_teardown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(share_auto, "rank_zero_info", lambda message: None)
    assert PipelineCallback(mode="worker", mps=True, worker_sm_percent=30).chosen_worker_sm_percent == 30
    callback = PipelineCallback(mode="worker", mps=True, worker_sm_percent="auto")
    assert callback.chosen_worker_sm_percent is None and callback.share_choice is None
    started: list[_Client] = []
    auto = AutoShare(lambda p, s: started.append(_Client(p, s)) or started[-1], torch.device("cpu"),
                     ShareCalibrator(warmup=1, steps=3))  # fmt: skip
    callback._session = PipelineSession(("train",), auto=auto)
    calibrator = auto.calibrator
    for _ in range(4):  # 10 %: a 50 ms build does not fit in a 4 ms step
        calibrator.record(50.0, 4.0)
    assert calibrator.current == 20 and callback.chosen_worker_sm_percent is None
    for _ in range(4):  # 20 %: 1 ms fits
        calibrator.record(1.0, 4.0)
    assert callback.chosen_worker_sm_percent == 20
    callback.teardown(None, None, "fit")  # type: ignore[arg-type]
    assert callback._session is None and all(c.closed for c in started)
    assert callback.chosen_worker_sm_percent == 20
    choice = callback.share_choice
    assert (choice.percent, choice.build_ms, choice.step_ms, choice.keeps_pace) == (20, 1.0, 4.0, True)
    # a later fit that ends before its calibration decides: undecided again
    auto = AutoShare(lambda p, s: _Client(p, s), torch.device("cpu"), ShareCalibrator(warmup=1, steps=3))
    callback._session = PipelineSession(("train",), auto=auto)
    callback.teardown(None, None, "fit")  # type: ignore[arg-type]
    assert callback.chosen_worker_sm_percent is None and callback.share_choice is None
