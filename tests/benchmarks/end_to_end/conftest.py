"""The benchmark tests' fixtures: one ``--preset ci`` run of each one-model benchmark (``link``, ``hetero``) per test
session, read by the tests they share (``test_one_model_benchmarks.py``) and by each benchmark's own."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from helpers.one_model_runs import ONE_MODEL, run_benchmark


@pytest.fixture(scope="session")
def one_model_ci_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The output folder of a benchmark's ``--preset ci`` run (CPU rows on a few thousand nodes), by name; run once,
    its graph cached in the folder's sibling ``cache``."""
    outs: dict[str, Path] = {}

    def ci_run(name: str) -> Path:
        if name not in outs:
            tmp = tmp_path_factory.mktemp(name)
            run_benchmark(ONE_MODEL[name], "--preset", "ci", "--out", str(tmp / "out"), "--cache-dir", str(tmp / "cache"))
            outs[name] = tmp / "out"
        return outs[name]

    return ci_run
