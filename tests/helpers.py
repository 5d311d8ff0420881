"""Helpers shared by test files of several directories (``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import mmap
import subprocess
import time
from typing import Optional

import torch


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts: it runs nothing and holds no GPU context)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


def wait_process_gone(pid: int, timeout: float) -> bool:
    """Poll :func:`process_gone` for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.05)
    return process_gone(pid)


def read_ready_line(proc: subprocess.Popen, timeout: float) -> Optional[str]:
    """The first stdout line of ``proc`` that starts with ``READY``, or ``None`` if it exits or ``timeout``
    seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY"):
            return line
        if not line and proc.poll() is not None:
            return None
    return None


def exclusive_host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in its own anonymous memory mapping (like the shared-memory tables the library registers).
    Registration works on whole pages, so heap memory shared with other tensors would share registrations."""
    nbytes = t.numel() * t.element_size()
    mapping = mmap.mmap(-1, max(nbytes, 1))
    out = torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def matmul_tflops(size: int = 8192, iters: int = 20) -> float:
    """bf16 matmul TFLOP/s of this process on its current CUDA device (random inputs, timed with events)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    end.synchronize()
    return 2 * size**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12
