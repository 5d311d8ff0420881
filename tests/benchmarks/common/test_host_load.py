"""Host CPU readings over a measured window: a scaling diagnostic's epochs, an e2e row's steady window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks.common.host_load import SteadyHostLoad


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_host_load_reads_this_process_and_its_children() -> None:
    from benchmarks.common.host_load import HostLoad, read_process

    own = read_process(os.getpid())
    assert own is not None and own["cpu_s"] > 0 and len(own["threads"]) >= 1
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: pass"])
    try:
        load = HostLoad(lambda epoch: "warmup" if epoch == 0 else "data", is_rank=lambda cmd: False)
        trainer = SimpleNamespace(current_epoch=1)
        load.on_train_epoch_start(trainer, None)
        time.sleep(0.5)
        load.closer().on_train_epoch_end(trainer, None)
    finally:
        child.kill()
        child.wait()
    figures = load.phases["data"]
    roles = {p["pid"]: p for p in figures["processes"]}
    assert roles[os.getpid()]["role"] == "trainer" and roles[child.pid]["role"] == "other"
    assert roles[child.pid]["cores"] > 0.05 and roles[child.pid]["busiest_threads"]
    assert figures["cpu_count"] == os.cpu_count() and figures["machine_busy_cores"] >= 0
    # the busy child's main thread: where it ran and how long it waited for a core; the hypervisor's steal
    assert 0 <= roles[child.pid]["main_cpu"] < os.cpu_count() and roles[child.pid]["main_runqueue_ms_per_s"] >= 0
    assert 0 <= figures["steal_cores"] <= os.cpu_count()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_the_steady_window_opens_at_the_warm_up_step_and_closes_at_the_end():
    load = SteadyHostLoad(warmup=2)
    trainer = SimpleNamespace(global_step=0)
    for step in range(2):
        trainer.global_step = step
        load.on_train_batch_start(trainer, None, None, step)
    assert load.load._start is None  # not open during warm-up
    trainer.global_step = 2
    load.on_train_batch_start(trainer, None, None, 2)
    busy = time.perf_counter() + 0.3
    while time.perf_counter() < busy:  # this thread on a core for the window
        pass
    load.on_train_end(trainer, None)
    figures = load.figures
    assert figures is not None and figures["wall_s"] >= 0.3
    (trainer_row,) = [p for p in figures["processes"] if p["pid"] == os.getpid()]
    assert trainer_row["role"] == "trainer" and trainer_row["cores"] > 0.3


def test_no_window_without_its_warm_up_step():
    load = SteadyHostLoad(warmup=5)
    load.on_train_end(SimpleNamespace(global_step=3), None)  # training ended before step 5
    assert load.figures is None
