"""The sync finder of the scaling diagnostic: which steps it watches, and how it names the caller of each sync."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

from benchmarks.scaling.knobs import parse_knobs
from benchmarks.scaling.sync_finder import SyncFinder


def _user_forward(syncs: int) -> None:
    for _ in range(syncs):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
    warnings.warn("an unrelated warning", UserWarning)


def test_counts_the_syncs_of_the_watched_data_steps_by_caller() -> None:
    modes: list[str] = []
    finder = SyncFinder(lambda epoch: "model" if epoch else "data", steps=3, skip=1, set_mode=modes.append)
    data, model = SimpleNamespace(current_epoch=0), SimpleNamespace(current_epoch=1)
    for step in range(6):  # one skipped, three watched, two past the count
        finder.on_train_batch_start(data, None, None, step)
        _user_forward(2)
        finder.on_train_batch_end(data, None, None, None, step)
    finder.on_train_batch_start(model, None, None, 0)  # another phase: not watched
    _user_forward(5)
    finder.on_train_batch_end(model, None, None, None, 0)
    summary = finder.summary()
    assert summary["steps"] == 3 and modes == ["warn", "default"] * 3
    [(caller, per_step)] = summary["per_step"].items()
    assert per_step == 2.0 and caller.startswith("test_scaling_sync_finder.py:") and "_user_forward" in caller
    assert "counts_the_syncs" in caller  # the frames around it, innermost first
    assert warnings.showwarning.__name__ != "_record"  # the warning machinery is restored


def test_the_knob_turns_it_on() -> None:
    assert parse_knobs("sync_debug_steps=20") == {"run": {"sync_debug_steps": 20}}
