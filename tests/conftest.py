"""Shared pytest configuration.

CUDA tests carry ``@pytest.mark.cuda`` (markers are declared in ``pyproject.toml``) and are skipped where no GPU
is present. On a GPU machine,
``REQUIRE_CUDA=1`` turns every skipped CUDA test into a failure, so a GPU run cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest
import torch

REQUIRE_CUDA = os.environ.get("REQUIRE_CUDA", "0") == "1"


def _cuda_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA GPU available"
    import lightning_zerocopy

    if not lightning_zerocopy.WITH_CUDA:
        return False, "lightning_zerocopy._C was built without CUDA kernels"
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ready, why = _cuda_ready()
    if ready:
        return
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CUDA and "cuda" in item.keywords and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"REQUIRE_CUDA=1 but this CUDA test was skipped: {report.longrepr}"
