"""The worker-share rule: the smallest share of the ladder that builds a batch within the step (with headroom)."""

from __future__ import annotations

import pytest

from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER, ShareCalibrator, choose_share


def test_the_smallest_share_that_keeps_pace_is_chosen() -> None:
    # issue 20's heavy batch: 9.9 ms under 10 %, against a 4.65 ms step
    choice = choose_share({10: 9.9, 20: 5.6, 30: 3.9}, step_ms=4.65)
    assert (choice.percent, choice.keeps_pace) == (30, True)
    assert choose_share({10: 3.3, 20: 2.0, 30: 1.6}, step_ms=4.65).percent == 10  # the light batch
    assert choose_share({30: 4.0, 10: 4.1, 20: 4.0}, step_ms=4.65, headroom=1.0).percent == 10


def test_when_no_share_keeps_pace_the_fastest_is_chosen_and_said_so() -> None:
    choice = choose_share({10: 9.9, 20: 6.1, 30: 6.3}, step_ms=4.65)
    assert (choice.percent, choice.keeps_pace) == (20, False)
    assert "cannot keep pace" in choice.summary() and "6.10 ms" in choice.summary()


def test_shares_outside_the_ladder_or_unmeasured_are_ignored() -> None:
    assert choose_share({50: 1.0, 20: 2.0}, step_ms=4.0).percent == 20
    assert SHARE_LADDER == (10, 20, 30)


@pytest.mark.parametrize("build, step, headroom, match", [
    ({}, 4.0, 0.9, "no build time measured"),
    ({10: 0.0}, 4.0, 0.9, "build times must be > 0"),
    ({10: 1.0}, 0.0, 0.9, "step_ms"),
    ({10: 1.0}, 4.0, 1.5, "headroom"),
])  # fmt: skip
def test_bad_measurements_are_refused_naming_what(build, step, headroom, match) -> None:
    with pytest.raises(ValueError, match=match):
        choose_share(build, step_ms=step, headroom=headroom)


def test_the_calibrator_moves_up_the_ladder_until_a_share_keeps_pace() -> None:
    from lightning_zerocopy.pipeline.share_choice import ShareCalibrator

    build = {10: 9.9, 20: 5.6, 30: 3.9}  # a heavy batch against issue 20's 4.65 ms step
    cal = ShareCalibrator(warmup=2, steps=3)
    moves = []
    for _ in range(100):
        move = cal.record(build[cal.current], 4.65)
        if move is not None:
            moves.append(move)
        if cal.done:
            break
    assert moves == [20, 30] and cal.done and cal.choice.percent == 30 and cal.choice.keeps_pace
    assert cal.record(1.0, 4.65) is None  # decided: no more moves


def test_the_calibrator_keeps_the_first_share_that_keeps_pace_and_falls_back_to_the_fastest() -> None:
    from lightning_zerocopy.pipeline.share_choice import ShareCalibrator

    light = ShareCalibrator(warmup=0, steps=2)
    assert [light.record(3.3, 4.65), light.record(3.3, 4.65)] == [None, None]
    assert light.done and light.choice.percent == 10
    slow = ShareCalibrator(warmup=0, steps=1)
    build = {10: 9.0, 20: 6.0, 30: 7.0}
    moves = [slow.record(build[slow.current], 4.0) for _ in range(3)]
    assert moves == [20, 30, 20] and slow.choice.percent == 20 and not slow.choice.keeps_pace


def test_an_unfinished_calibration_says_what_it_measured_and_what_it_needs() -> None:
    calibrator = ShareCalibrator((10, 20, 30), warmup=2, steps=3)
    assert calibrator.steps_needed == 15
    assert "no share yet" in calibrator.unfinished()
    for _ in range(5):
        calibrator.record(build_ms=9.0, step_ms=5.0)  # 10 % cannot keep pace: moves to 20 %
    text = calibrator.unfinished()
    assert not calibrator.done and "10%: build 9.00 ms vs step 5.00 ms" in text and "kept 20%" in text
    assert "up to 15 training steps" in text
