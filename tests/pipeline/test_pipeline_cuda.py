"""The pipeline on a GPU: CUDA IPC of slot buffers and the slot handshake (also under MPS), the MPS SM share,
and no interprocess-event files left in /dev/shm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.pipeline_fakes import FakeSource

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.pipeline import mps, start_pipeline
from lightning_zerocopy.pipeline.source import PlanSource

HERE = Path(__file__).resolve().parent
FIELDS = ("x", "y", "n_id", "e_id", "edge_index", "input_id", "num_sampled_nodes", "num_sampled_edges", "batch_size")


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_gpu_slots_are_not_rewritten_while_queued_work_reads_them(mode):
    """Depth 1: every batch reuses the slot of the previous one. The trainer's read of batch t is queued behind
    a long kernel; the slot may go back to the producer only once that read has run, and a ready slot must be
    complete before the trainer's stream reads it."""
    shm_before = set(os.listdir("/dev/shm"))
    client = start_pipeline(mode, depth=1, device="cuda:0", timeout=120)
    src = FakeSource(steps=6, features=512, batch_size=2048, seed=2, huge_at=3)
    client.register("t", src)
    try:
        sums = []
        for step, batch in enumerate(client.iterate("t", 0)):
            assert batch.x.is_cuda and batch.edge_index.is_cuda
            torch.cuda._sleep(20_000_000)
            sums.append((batch.x.double().sum(), batch.n_id.sum(), src.build_batch(src.plan(0, step))))
        for got_x, got_n, ref in sums:
            assert torch.isclose(got_x.cpu(), ref.x.double().sum(), rtol=1e-9)
            assert got_n.item() == ref.n_id.sum().item()
        assert client.stats.grows >= 1
    finally:
        client.close()
    # nothing of the worker's is left (torch's own IPC ref-count file and the driver's cuda.shm file of this
    # exporting process live until this process exits; test_under_mps... checks they are gone after exit)
    worker_pid = getattr(client.transport, "pid", None)
    if worker_pid is not None:
        leaked = [n for n in set(os.listdir("/dev/shm")) - shm_before if f".{worker_pid:x}." in n or str(worker_pid) in n]
        assert not leaked, f"shared-memory files of the worker left behind: {leaked}"


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["worker", "in_process"])
@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_gpu_builder_in_the_three_stage_pipeline_yields_build_batch_batches(tmp_path, monkeypatch, mode, placement):
    """The DataModule's GPU builder (zero-copy gather; CPU or GPU sampler) split over the producer's sampling
    thread and its gather stream: every field of every batch equals build_batch's, over two epochs."""
    dataset = SyntheticGraph(num_nodes=4000, avg_degree=10, num_features=24, num_classes=5, cache_dir=str(tmp_path))
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=256, seed=3, sampler_placement=placement,
                            gather="zerocopy")  # fmt: skip
    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # names stay until the worker opened them
    dm.setup("fit")
    plan, builder = dm.plan("train"), dm.builder("train")
    want = {(epoch, step): {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in
                            ((k, builder.build_batch(plan.item(epoch, step))[k]) for k in FIELDS)}
            for epoch in (0, 1) for step in range(len(plan))}  # fmt: skip
    client = start_pipeline(mode, depth=2, device="cuda:0", timeout=120)
    try:
        client.register("train", PlanSource(dm.plan("train"), dm.builder("train")))
        for epoch in (0, 1):
            count = 0
            for step, batch in enumerate(client.iterate("train", epoch)):
                for key in FIELDS:
                    got, ref = batch[key], want[(epoch, step)][key]
                    if isinstance(ref, torch.Tensor):
                        assert got.is_cuda and got.dtype == ref.dtype and torch.equal(got.cpu(), ref), (epoch, step, key)
                    else:
                        assert got == ref, (epoch, step, key)
                count += 1
            assert count == len(plan)
    finally:
        client.close()
        unlink(dm.handles)
        dm.teardown("fit")


@pytest.mark.cuda
def test_under_mps_ipc_works_and_the_worker_share_takes_effect():
    """Through the launcher (trainer at 50 % of the SMs): the script, which imports PyG and so could not start
    MPS for itself, is an MPS client limited to its share; batches cross CUDA IPC correctly; a worker at 10 %
    runs well below one at 90 %."""
    if __import__("shutil").which(mps.CONTROL_BINARY) is None:
        pytest.fail(f"{mps.CONTROL_BINARY} is not on PATH on this GPU machine")
    env = {k: v for k, v in os.environ.items() if k not in (mps.ROOT_ENV, mps.PIPE_ENV, mps.LOG_ENV, mps.PERCENT_ENV)}
    launcher = [sys.executable, "-m", "lightning_zerocopy.pipeline.mps_launcher", "--worker-sm-percent", "50", "--"]
    proc = subprocess.run(
        [*launcher, sys.executable, str(HERE.parent / "scripts" / "mps_cuda_script.py"), "10"], capture_output=True, text=True,
        timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    assert result["mps"], f"MPS did not start: {proc.stderr[-2000:]}"
    assert result["ipc_batches_ok"]
    assert result["launched"] and result["supervisor_pid"], result
    # the share decides, not the control log (a process outside MPS was seen logged there as a NEW CLIENT too):
    # a worker at 10 % of the SMs well under half its rate at 90 %; the trainer, at 50 %, clearly under 90 %'s
    assert result["worker_tflops"] < 0.35 * result["worker_tflops_at_90"], result
    assert result["trainer_tflops"] < 0.75 * result["worker_tflops_at_90"], result
    # the supervisor stops the daemon once the script (its owner) has exited
    deadline = time.monotonic() + 60
    while mps._alive(result["daemon_pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not mps._alive(result["daemon_pid"]), "MPS daemon still running after its owner exited"
    # the supervisor (started by the launcher; the script read its pid from the daemon state)
    # removes the private directory after the daemon and any server it left are gone, then exits
    root = Path(result["root"])
    while (root.exists() or mps._alive(result["supervisor_pid"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not mps._alive(result["supervisor_pid"]), "MPS supervisor still running after stopping the daemon"
    assert not root.exists(), f"the MPS directory {root} outlived the daemon by more than the deadline"
    # the exited trainer left no shared-memory file (torch's IPC ref counts, the driver's cuda.shm file)
    trainer = result["trainer_pid"]
    left = [n for n in os.listdir("/dev/shm") if f".{trainer:x}." in n or f"torch_{trainer}_" in n]
    assert not left, f"the trainer process left {left} in /dev/shm"


_IPC_EXIT_SCRIPT = """
import sys, torch
sys.path[:0] = [{here!r}, {tests!r}]
from helpers.pipeline_fakes import FakeSource
from lightning_zerocopy.pipeline import start_pipeline

if __name__ == "__main__":  # the worker is spawned: it imports this file again and must not run it
    client = start_pipeline("worker", depth=2, device="cuda:0", timeout=120)
    client.register("t", FakeSource(steps=6, features=64, batch_size=512, seed=4, huge_at=3))
    torch.cuda.synchronize()
    for batch in client.iterate("t", 0):
        batch.x.sum()
    del batch
    client.close()
    torch.cuda.ipc_collect()
    print("ALLOCATED_AFTER_CLOSE", torch.cuda.memory_allocated(), flush=True)
"""


@pytest.mark.cuda
def test_worker_releases_the_slots_before_it_exits_so_the_trainer_frees_them_and_prints_no_ipc_warning(tmp_path):
    """The trainer allocates the slots and shares them over CUDA IPC (torch's *producer*); the worker is the
    consumer and must free what it received before ``os._exit``. Otherwise torch's shared counters never drop: the
    slots' GPU memory stays in torch's limbo after ``close()`` and the trainer's exit prints "Producer process has
    been terminated before all shared CUDA tensors released" (issue 22)."""
    script = tmp_path / "ipc_exit.py"
    script.write_text(_IPC_EXIT_SCRIPT.format(here=str(HERE), tests=str(HERE.parent)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    allocated = int(proc.stdout.split("ALLOCATED_AFTER_CLOSE")[1].split()[0])
    assert allocated == 0, f"{allocated} bytes of slots still held after close() (CUDA IPC limbo)"
    assert "shared CUDA tensors released" not in proc.stderr, proc.stderr[-3000:]
