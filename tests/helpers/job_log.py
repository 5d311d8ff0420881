"""A command started by a fault test, its output written to a file rather than a pipe.

A pipe that nobody reads while the test waits for a signal's effect fills up (64 KiB); a process that then writes
(a warning, a stack dump on SIGABRT) blocks and looks as if it ignored the signal. A file never blocks the writer.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any, Optional

__all__ = ["output_of", "process_report", "start_logged"]


def start_logged(args: list[str], log: Path, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **popen)`` with stdout and stderr going to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, text=True, **popen)
    proc.log_path = log  # type: ignore[attr-defined]
    return proc


def output_of(proc: subprocess.Popen, timeout: Optional[float] = None) -> str:
    """Waits for ``proc`` (``subprocess.TimeoutExpired`` after ``timeout`` s) and returns what it printed."""
    proc.wait(timeout=timeout)
    return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]


def process_report(pid: int) -> str:
    """One line per thread of a live process: its state, what it waits in, and the signals it catches or blocks."""
    root = Path(f"/proc/{pid}")
    try:
        status = dict(line.split(":", 1) for line in (root / "status").read_text().splitlines() if ":" in line)
    except OSError as error:
        return f"pid {pid}: {error}"

    def names(mask: str) -> list[str]:
        bits = int(mask.strip(), 16)
        return [signal.Signals(n).name for n in range(1, 32) if bits >> (n - 1) & 1 and n in signal.valid_signals()]

    lines = [f"pid {pid} {status.get('Name', '').strip()} state {status.get('State', '').strip()}: catches "
             f"{names(status.get('SigCgt', '0'))}, blocks {names(status.get('SigBlk', '0'))}"]  # fmt: skip
    for task in sorted((root / "task").glob("*")):
        try:
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        lines.append(f"  thread {task.name} {comm}: {stat} in {wchan or '-'}")
    return "\n".join(lines)
