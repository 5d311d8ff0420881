"""The worker-share rule: the smallest share of the ladder that builds a batch within the step (with headroom)."""

from __future__ import annotations

import pytest

from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER, choose_share


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
