"""AutoShare on the CPU: a run that ends before the calibration decides still says what it measured."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy.callbacks import share_auto
from lightning_zerocopy.callbacks.share_auto import AutoShare
from lightning_zerocopy.pipeline.share_choice import ShareCalibrator


class _Client:
    def __init__(self, percent: int, standby: bool) -> None:
        self.percent, self.standby, self.closed = percent, standby, False

    def close(self) -> None:
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
