"""What the GPU ran at while a benchmark row trained: SM and memory clocks, power, temperature, why clocks were held,
the PCIe link's generation and width, and the host's dirty and writeback page cache.

:class:`GpuClocks` polls ``nvidia-smi`` once a second on a thread of the orchestrating process (not in a row's
process: a fork there would copy the page tables of its pinned host tables), and :meth:`GpuClocks.window` sums up the
samples inside a row's steady window (its ``steady_wall``, wall-clock seconds). A row whose step time differs from an
identical row's on the same machine can then be told apart: lower SM clocks or a power or thermal cap (the GPU ran
slower) against the same clocks (the rows contended for something inside it). The link and the page cache speak to
the zero-copy reads over PCIe: a link trained down, or gigabytes of a just-written dataset being written back while a
row reads host memory (2026-11-30: a row run straight after drawing its graph gathered at 6 GB/s, 21 after). Without
``nvidia-smi`` it records nothing and says why.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from statistics import mean
from typing import Any, Optional

__all__ = ["GpuClocks", "parse_sample"]

#: ``nvidia-smi --query-gpu`` fields, in this order; the reasons field, last, is a bitmask (0 when clocks are not held).
FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu", "pcie.link.gen.current",
          "pcie.link.width.current", "clocks_event_reasons.active")  # fmt: skip
#: The reasons field's name on drivers before ``clocks_event_reasons`` (the rest are the same).
OLD_REASONS = "clocks_throttle_reasons.active"
_PCIE = {"pcie.link.gen.current": "pcie_gen", "pcie.link.width.current": "pcie_width"}
_FLOATS = {"clocks.sm": "sm_mhz", "clocks.mem": "mem_mhz", "power.draw": "power_w", "temperature.gpu": "temp_c",
           "utilization.gpu": "util"}  # fmt: skip
#: What a driver is asked, in turn, until one query works: the reasons' older name, then without the PCIe link.
FIELD_SETS = (FIELDS, (*FIELDS[:-1], OLD_REASONS), tuple(f for f in FIELDS if f not in _PCIE),
              tuple(f for f in (*FIELDS[:-1], OLD_REASONS) if f not in _PCIE))  # fmt: skip


def parse_sample(line: str, fields: tuple[str, ...] = FIELDS) -> Optional[dict[str, Any]]:
    """One GPU's ``nvidia-smi --format=csv,noheader,nounits`` line of ``fields``; ``None`` if it does not parse
    (the PCIe link's fields may be ``[N/A]``, e.g. in a VM, or not asked: ``None`` each)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(fields):
        return None
    sample: dict[str, Any] = {"pcie_gen": None, "pcie_width": None}
    try:
        for name, text in zip(fields, parts):
            if name in _FLOATS:
                sample[_FLOATS[name]] = float(text)
            elif name in _PCIE:
                sample[_PCIE[name]] = int(text) if text.isdigit() else None
            else:
                sample["reasons"] = int(text, 16)
    except ValueError:
        return None
    return sample


def page_cache_mb(meminfo: str = "/proc/meminfo") -> dict[str, Optional[float]]:
    """The host's ``Dirty`` and ``Writeback`` page cache in MB (``None`` each where the file or line is missing)."""
    out: dict[str, Optional[float]] = {"dirty_mb": None, "writeback_mb": None}
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                key = {"Dirty": "dirty_mb", "Writeback": "writeback_mb"}.get(name)
                if key is not None:
                    out[key] = round(int(rest.split()[0]) / 1024, 1)  # kB
    except (OSError, ValueError, IndexError):
        pass
    return out


class GpuClocks:
    """A context manager that samples GPU ``index`` every ``every_s`` seconds while it is open.

    Args:
        enabled: ``False`` records nothing (a CPU run).
        index: the GPU's ``nvidia-smi`` index.
        every_s: seconds between samples.
    """

    def __init__(self, enabled: bool = True, index: int = 0, every_s: float = 1.0) -> None:
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self.problem: Optional[str] = None if enabled else "not sampled (no GPU rows)"
        self.enabled, self.index, self.every_s = enabled, index, every_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._fields = FIELD_SETS[0]
        if enabled and shutil.which("nvidia-smi") is None:
            self.problem = "nvidia-smi is not on PATH"

    def _query(self) -> Optional[str]:
        cmd = ["nvidia-smi", f"--id={self.index}", f"--query-gpu={','.join(self._fields)}",
               "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.problem = f"nvidia-smi failed: {exc}"
            return None
        later = FIELD_SETS.index(self._fields) + 1
        if done.returncode != 0 and later < len(FIELD_SETS):  # an older driver: the next set of fields
            self._fields = FIELD_SETS[later]
            return self._query()
        if done.returncode != 0:
            self.problem = f"nvidia-smi exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
            return None
        return done.stdout

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self._query()
            if out is None:
                return
            sample = parse_sample(out.strip().splitlines()[0], self._fields) if out.strip() else None
            if sample is not None:
                self.samples.append((time.time(), {**sample, **page_cache_mb()}))
            self._stop.wait(self.every_s)

    def __enter__(self) -> "GpuClocks":
        if self.problem is None:
            self._thread = threading.Thread(target=self._run, name="gpu-clocks", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """The samples taken in ``[start, end]`` (wall-clock seconds): means, the SM clock's minimum, the hottest
        reading, and every clock-holding reason seen (a bitmask, ``nvidia-smi -q -d PERFORMANCE`` names the bits)."""
        inside = [s for t, s in self.samples if start <= t <= end]
        if not inside:
            return {"samples": 0, "why": self.problem or "no sample inside the window"}
        reasons = 0
        for s in inside:
            reasons |= s["reasons"]

        def extreme(key: str, pick: Any = min) -> Optional[float]:
            seen = [s[key] for s in inside if s.get(key) is not None]
            return pick(seen) if seen else None

        return {"samples": len(inside), "sm_mhz": round(mean(s["sm_mhz"] for s in inside)),
                "sm_mhz_min": round(min(s["sm_mhz"] for s in inside)),
                "mem_mhz": round(mean(s["mem_mhz"] for s in inside)),
                "power_w": round(mean(s["power_w"] for s in inside), 1), "temp_c_max": max(s["temp_c"] for s in inside),
                "util": round(mean(s["util"] for s in inside), 1), "reasons": f"{reasons:#x}",
                "pcie_gen_min": extreme("pcie_gen"), "pcie_width_min": extreme("pcie_width"),
                "dirty_mb_max": extreme("dirty_mb", max), "writeback_mb_max": extreme("writeback_mb", max)}  # fmt: skip
