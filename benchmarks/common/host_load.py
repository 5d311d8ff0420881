"""What a rank's processes ask of the host's CPUs while it trains: threads, CPU use, involuntary context switches.

:class:`HostLoad` reads ``/proc`` at the start and the end of every measured epoch (never during its steps): for this
rank's process and each process it started that is not another rank (the pipeline worker, the MPS supervisor), the
OS threads, the CPU time of the process and of each of its threads, and the involuntary context switches (a thread
that was runnable but lost its core: the sign of more runnable threads than cores); for the machine, the busy share
of all cores (``/proc/stat``) and the load average. Figures per epoch: ``cores`` (CPU seconds per wall second, so
1.0 is one core kept busy), ``involuntary_per_s``, ``threads``, the busiest threads by name, and the machine's
``busy_cores`` over ``cpu_count``. Linux only; elsewhere the figures are empty.

For the process's main thread (the one that launches the step's kernels) also ``main_runqueue_ms_per_s``, the time it
was runnable but waited for a core (``/proc/.../schedstat``: contention inside this machine), and ``main_cpu``, the
core it last ran on; for the machine ``steal_cores``, the cores' time the hypervisor gave to others while they had
work (``/proc/stat``'s steal: contention outside a virtual machine, which no setting of the run changes).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl

__all__ = ["HostLoad", "SteadyHostLoad", "mps_pids", "process_tree", "read_process", "thread_settings"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` line after the command name (which may hold spaces): state first."""
    return text[text.rfind(")") + 2 :].split()


def _involuntary(status: Optional[str]) -> int:
    for line in (status or "").splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def read_process(pid: int) -> Optional[dict[str, Any]]:
    """CPU seconds, involuntary context switches and threads of ``pid`` (summed over its threads), with each
    thread's name, CPU seconds and involuntary switches; ``None`` once it is gone."""
    threads: dict[int, tuple[str, float, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        stat = _read(f"/proc/{pid}/task/{tid}/stat")
        if stat is None:
            continue
        fields = _stat_fields(stat)
        name = (_read(f"/proc/{pid}/task/{tid}/comm") or "?").strip()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        threads[int(tid)] = (name, cpu, _involuntary(_read(f"/proc/{pid}/task/{tid}/status")))
    main = _read(f"/proc/{pid}/task/{pid}/schedstat")
    main_stat = _read(f"/proc/{pid}/task/{pid}/stat")
    return {"cpu_s": sum(t[1] for t in threads.values()), "involuntary": sum(t[2] for t in threads.values()),
            "threads": threads, "main_runqueue_s": int(main.split()[1]) / 1e9 if main and len(main.split()) > 1 else None,
            "main_cpu": int(_stat_fields(main_stat)[36]) if main_stat and len(_stat_fields(main_stat)) > 36 else None}  # fmt: skip


def process_tree(root: int, skip: Callable[[str], bool]) -> dict[int, str]:
    """``root`` and its descendants as ``pid -> command line``, leaving out (with their own descendants) those whose
    command line ``skip`` picks (another rank, which reports its own)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat:
                parents[int(entry)] = int(_stat_fields(stat)[1])
    out, frontier = {root: _cmdline(root)}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in out:
                cmd = _cmdline(pid)
                if not skip(cmd):
                    out[pid] = cmd
                    frontier.append(pid)
    return out


def mps_pids() -> dict[int, str]:
    """``pid -> name`` of the machine's MPS control daemons and servers (``nvidia-cuda-mps-*``)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            name = (_read(f"/proc/{entry}/comm") or "").strip()
            if name.startswith("nvidia-cuda-mps"):
                out[int(entry)] = name
    return out


def _cmdline(pid: int) -> str:
    return (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()


def _role(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "trainer"
    if "multiprocessing" in cmd and "spawn" in cmd:
        return "worker"
    if "--supervise" in cmd or "(mps)" in cmd:
        return "mps"
    return "other"


def _system() -> tuple[float, float, str, float]:
    """Busy and total jiffies of all cores (``/proc/stat``), the load average and the steal jiffies."""
    busy = total = steal = 0.0
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("cpu "):
            values = [float(v) for v in line.split()[1:]]
            total = sum(values[:8])  # user .. steal (guest time is inside user)
            busy = total - values[3] - (values[4] if len(values) > 4 else 0.0)  # minus idle and iowait
            steal = values[7] if len(values) > 7 else 0.0
            break
    return busy, total, (_read("/proc/loadavg") or "").strip(), steal


def thread_settings(sampler_threads: Optional[int]) -> dict[str, Any]:
    """The thread settings of this process: torch's intra- and inter-op threads, ``OMP_NUM_THREADS``, the sampler's
    threads (``None``: the DataModule's default, torch's count), the cores and this process's CPU affinity."""
    import torch

    try:
        affinity: Optional[int] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "sampler_threads": sampler_threads,
            "cpu_count": os.cpu_count(), "affinity_cores": affinity}  # fmt: skip


class HostLoad(pl.Callback):
    """CPU figures of this rank's processes over every measured epoch (see the module docstring).

    Args:
        phase_of: the phase name of an epoch; epochs named ``skip_phase`` (the warm-up) are not measured.
        is_rank: picks another rank's command line (left out of this rank's processes).
        top: the busiest threads kept per process.
    """

    def __init__(self, phase_of: Callable[[int], str], is_rank: Callable[[str], bool], skip_phase: str = "warmup",
                 top: int = 6, include_mps: bool = False) -> None:  # fmt: skip
        self.phase_of, self.is_rank, self.skip_phase, self.top = phase_of, is_rank, skip_phase, top
        self.include_mps = include_mps
        self.phases: dict[str, dict[str, Any]] = {}
        self._start: Optional[tuple[float, dict[int, Any], dict[int, str], tuple[float, float, str, float]]] = None

    def _snapshot(self) -> tuple[float, dict[int, Any], dict[int, str], tuple[float, float, str, float]]:
        tree = process_tree(os.getpid(), self.is_rank)
        if self.include_mps:  # the MPS control daemon and server are no one's children (the daemon detaches)
            tree.update({pid: f"{name} (mps)" for pid, name in mps_pids().items() if pid not in tree})
        return time.perf_counter(), {pid: read_process(pid) for pid in tree}, tree, _system()

    def begin(self) -> None:
        """The opening reading of a measured window (none where there is no ``/proc``)."""
        self._start = self._snapshot() if os.path.isdir("/proc/self/task") else None

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.phase_of(trainer.current_epoch) != self.skip_phase:
            self.begin()
        else:
            self._start = None

    def closer(self) -> pl.Callback:
        """The callback that takes the epoch's closing reading: put it after the epoch clock (and this one before
        it), so that reading ``/proc`` stays out of the timed epoch."""
        return _Close(self)

    def finish(self, trainer: "pl.Trainer") -> None:
        """The epoch's closing reading and its figures (called by :meth:`closer`'s callback)."""
        self.end(self.phase_of(trainer.current_epoch))

    def end(self, phase: str) -> None:
        """The closing reading of the window :meth:`begin` opened; its figures go to ``phases[phase]``."""
        if self._start is None:
            return
        t0, before, _, (busy0, total0, _, steal0) = self._start
        t1, after, tree, (busy1, total1, load, steal1) = self._snapshot()
        wall = max(t1 - t0, 1e-9)
        processes = []
        for pid, now in after.items():
            if now is None:
                continue
            then = before.get(pid) or {"cpu_s": 0.0, "involuntary": 0, "threads": {}}
            busiest = []
            for tid, (name, cpu, _) in now["threads"].items():
                earlier = then["threads"].get(tid)
                busiest.append((cpu - (earlier[1] if earlier else 0.0), name))
            busiest.sort(reverse=True)
            waited = (now.get("main_runqueue_s"), then.get("main_runqueue_s"))
            processes.append({"pid": pid, "role": _role(pid, tree.get(pid, "")), "threads": len(now["threads"]),
                              "cores": round((now["cpu_s"] - then["cpu_s"]) / wall, 3),
                              "involuntary_per_s": round((now["involuntary"] - then["involuntary"]) / wall, 1),
                              "main_runqueue_ms_per_s": None if None in waited else round(1e3 * (waited[0] - waited[1]) / wall, 2),
                              "main_cpu": now.get("main_cpu"),
                              "busiest_threads": [[name, round(cpu / wall, 3)] for cpu, name in busiest[: self.top]]})  # fmt: skip
        cpus = os.cpu_count() or 1
        jiffies = max(total1 - total0, 1e-9)
        self._start = None
        self.phases[phase] = {
            "wall_s": round(wall, 3), "processes": processes, "machine_busy_cores": round((busy1 - busy0) / jiffies * cpus, 2),
            "steal_cores": round((steal1 - steal0) / jiffies * cpus, 3), "cpu_count": cpus, "loadavg": load,
        }  # fmt: skip


class _Close(pl.Callback):
    def __init__(self, load: HostLoad) -> None:
        self.load = load

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.load.finish(trainer)


class SteadyHostLoad(pl.Callback):
    """:class:`HostLoad` over one training run's steady window, from the start of step ``warmup`` to the end of
    training: this process and every process it started (the pipeline worker), the MPS daemon and server too.

    Put it before the run's clock among the callbacks, so that the opening reading precedes the clock's start (the
    closing one then falls inside the clock's last interval: a few milliseconds of ``/proc`` reads).
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.load = HostLoad(lambda epoch: "steady", is_rank=lambda cmd: False, include_mps=True)
        self._begun = False

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        if not self._begun and trainer.global_step >= self.warmup:
            self._begun = True
            self.load.begin()

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.load.end("steady")

    @property
    def figures(self) -> Optional[dict[str, Any]]:
        """The window's figures (``None`` before its end, or without ``/proc``)."""
        return self.load.phases.get("steady")
