"""ReadOrderChooser in its fixed modes (the timed ``auto`` mode runs in tests/gather/test_feature_cache_cuda.py)."""

from __future__ import annotations

import pytest

from lightning_zerocopy.gather.read_order import ReadOrderChooser


@pytest.mark.parametrize("mode, sort", [("direct", False), ("sorted", True)])
def test_fixed_mode_runs_that_order(mode, sort):
    calls = []
    chooser = ReadOrderChooser(mode)
    chooser.run(calls.append, rows=10, stream=None)
    assert calls == [sort] and chooser.chosen == mode and chooser.trial_times == {"direct": [], "sorted": []}


def test_auto_is_undecided_before_trials():
    assert ReadOrderChooser("auto").chosen is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="`mode`"):
        ReadOrderChooser("fast")
    with pytest.raises(ValueError, match="`trial_calls`"):
        ReadOrderChooser("auto", trial_calls=0)
