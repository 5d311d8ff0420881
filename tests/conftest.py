"""Shared pytest configuration.

CUDA tests carry ``@pytest.mark.cuda`` (markers are declared in ``pyproject.toml``) and are skipped where no GPU
is present. On a GPU machine,
``REQUIRE_CUDA=1`` turns every skipped CUDA test into a failure, so a GPU run cannot pass by skipping.
Tests that need two GPUs with peer access carry ``@pytest.mark.two_gpus`` (not ``cuda``: a one-GPU run skips
them); ``REQUIRE_TWO_GPUS=1`` turns a skipped one into a failure on a two-GPU machine.

``LZC_TEST_STACKS_AFTER_S=N`` writes every thread's stack of the pytest process to ``LZC_TEST_STACKS_FILE``
(default ``test_stacks.log``; a file, since pytest captures stderr) when one test has run for N seconds, and again
every N seconds while it runs, so a test that hangs shows where it waits even if a timeout kills the run.

``LZC_TEST_FAILURE_LOG=PATH`` appends each failure's report to PATH as soon as the test fails, so a run cut by a
time limit before pytest's summary still says why each test failed (the GPU sessions set it).
"""

from __future__ import annotations

import faulthandler
import os
import time

import pytest
import torch

REQUIRE_CUDA = os.environ.get("REQUIRE_CUDA", "0") == "1"
REQUIRE_TWO_GPUS = os.environ.get("REQUIRE_TWO_GPUS", "0") == "1"
STACKS_AFTER_S = float(os.environ.get("LZC_TEST_STACKS_AFTER_S", "0") or 0)
STACKS_FILE = os.environ.get("LZC_TEST_STACKS_FILE", "test_stacks.log")
FAILURE_LOG = os.environ.get("LZC_TEST_FAILURE_LOG", "")
_stacks_log = None


def _cuda_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA GPU available"
    import lightning_zerocopy

    if not lightning_zerocopy.WITH_CUDA:
        return False, "lightning_zerocopy._C was built without CUDA kernels"
    return True, ""


def _two_gpus_ready() -> tuple[bool, str]:
    ready, why = _cuda_ready()
    if not ready:
        return False, why
    if torch.cuda.device_count() < 2:
        return False, "needs two GPUs"
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        return False, "GPUs 0 and 1 have no peer access"
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ready, why = _cuda_ready()
    two = [item for item in items if "two_gpus" in item.keywords]
    if two:
        two_ready, two_why = _two_gpus_ready()
        if not two_ready:
            for item in two:
                item.add_marker(pytest.mark.skip(reason=two_why))
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
    if REQUIRE_TWO_GPUS and "two_gpus" in item.keywords and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"REQUIRE_TWO_GPUS=1 but this two-GPU test was skipped: {report.longrepr}"
    if FAILURE_LOG and report.failed:
        with open(FAILURE_LOG, "a") as log:
            log.write(f"==== {report.nodeid} ({report.when}) failed\n{report.longreprtext}\n")
            for name, text in report.sections:  # captured stdout/stderr/log of the test
                log.write(f"---- {name}\n{text[-20000:]}\n")


@pytest.fixture
def shared(node_data):
    """``(data, handles)``: the ``node_data`` fixture of the test's file (a ``NodeData``) shared into host memory by
    ``share_node_data``, its segments unlinked after the test."""
    from lightning_zerocopy.data.host.share import share_node_data

    handles = share_node_data(node_data)
    yield node_data, handles
    handles.unlink()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if STACKS_AFTER_S <= 0:
        yield
        return
    global _stacks_log
    if _stacks_log is None:
        _stacks_log = open(STACKS_FILE, "a", buffering=1)  # kept open: faulthandler writes to its descriptor
    print(f"\n[{time.strftime('%H:%M:%S')}] {item.nodeid}", file=_stacks_log, flush=True)
    faulthandler.dump_traceback_later(STACKS_AFTER_S, repeat=True, file=_stacks_log)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
