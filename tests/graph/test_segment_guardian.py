"""A creator killed while its shared segments still have names leaves nothing in /dev/shm: its guardian unlinks them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from helpers import read_ready_line
from lightning_zerocopy.graph.shared_memory import SHM_DIR_ENV, share_tensor

ROOT = Path(__file__).resolve().parents[2]

# creates named segments, then waits where the DataModule would wait for every local process to map them
_SHARE_TENSORS = """
import os, sys, time, torch
from lightning_zerocopy.graph.shared_memory import share_tensor
handles = [share_tensor(torch.arange(1000), name=f"t{i}")[1] for i in range(2)]
child = os.fork() if "--fork" in sys.argv else None  # a forked child that outlives its parent
if child == 0:
    time.sleep(60); os._exit(0)
print("READY", child or "", flush=True); time.sleep(60)
"""

# the DataModule's step 1 (data/host.py): graph, labels, splits and features in named segments, not unlinked yet
_SHARE_NODE_DATA = """
import time
from helpers import random_node_data
from lightning_zerocopy.data.host import share_node_data
handles = share_node_data(random_node_data(500, 3000, 8, seed=0, train=300, val=100))
print("READY", flush=True); time.sleep(60)
"""


def _ours(directory: Path, pid: int) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f"lzc-{pid}-"))


def _kill_in_the_window(tmp_path: Path, script: str, *args: str) -> tuple[str, list[str]]:
    """Run ``script`` with segments in ``tmp_path``, SIGKILL it once they exist; its READY line and the names left
    5 s later."""
    env = dict(os.environ, **{SHM_DIR_ENV: str(tmp_path)})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready = read_ready_line(proc, timeout=120)
        assert ready is not None, "the script did not create its segments"
        assert _ours(tmp_path, proc.pid), "no segment to leave behind"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _ours(tmp_path, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ready, _ours(tmp_path, proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_segments_of_a_killed_creator_are_unlinked(tmp_path: Path) -> None:
    _, left = _kill_in_the_window(tmp_path, _SHARE_TENSORS)
    assert left == []


def test_the_host_copy_of_a_killed_rank_0_is_unlinked(tmp_path: Path) -> None:
    _, left = _kill_in_the_window(tmp_path, _SHARE_NODE_DATA)
    assert left == []


def test_a_forked_child_does_not_keep_its_parents_segments(tmp_path: Path) -> None:
    ready, left = _kill_in_the_window(tmp_path, _SHARE_TENSORS, "--fork")
    os.kill(int(ready.split()[1]), signal.SIGKILL)  # the child, still alive while the names were checked
    assert left == []


def test_a_living_creators_segments_stay_until_it_unlinks(tmp_path: Path) -> None:
    tensor, handle = share_tensor(torch.arange(10), name="kept", directory=tmp_path)
    time.sleep(0.3)  # the guardian has read the note by now
    assert handle.exists() and torch.equal(handle.open(), torch.arange(10))
    handle.unlink()
    assert not handle.exists()


def test_the_guardian_removes_the_cuda_driver_files_of_a_dead_exporter(tmp_path) -> None:
    """A process that exported GPU memory over CUDA IPC may leave the driver's cuda.shm.<n>.<pid hex>.<k> files;
    its guardian removes them once it is gone (killed too), and nobody else's."""
    from lightning_zerocopy.graph.segment_guardian import remove_driver_files

    pid = 4242
    mine = [tmp_path / f"cuda.shm.0.{pid:x}.{k}" for k in (1, 2)]
    others = [tmp_path / f"cuda.shm.0.{pid + 1:x}.1", tmp_path / f"cuda.shm.x.{pid:x}.1", tmp_path / "lzc-4242-a"]
    for path in mine + others:
        path.write_bytes(b"")
    remove_driver_files(pid, folder=str(tmp_path))
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
