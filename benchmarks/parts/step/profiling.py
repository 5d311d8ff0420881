"""Where the host time of a steady-state training step goes (``python -m benchmarks.parts.step ... --profile``).

For each row, after its timed run, the same training runs twice more on the same staged batches: once under
``cProfile`` and once under ``torch.profiler`` (CPU activity only), each over ``--profile-steps`` steps after
``--warmup``, measured start of a step to start of the step after the last (a whole number of steps, logging
steps included in their share). Figures are per step:

* ``groups_us``: the host time by who spends it. A Python function's own time counts to its file's group; a C
  function's (a torch op, ``backward``'s engine call, a builtin) and the standard library's (``contextlib``,
  ``inspect``) to the group of the function that called it, so the optimizer's ``torch._foreach_*`` calls count to
  the optimizer, PyG's ops to PyG and Lightning's ``with profiler.profile(...)`` to Lightning (``C / stdlib``: called
  from C or the standard library itself). The groups add up to the profiled time.
* ``top_cumulative`` / ``top_self``: the functions with the most cumulative / own time (C calls in their own
  rows), with calls per step.
* ``top_ops`` and ``ops_per_step``: torch.profiler's operators by self CPU time, and how many ``aten::`` calls a
  step makes (on a GPU, roughly how many kernels a step launches and what the dispatcher handles).

cProfile adds a constant cost per Python call, so its wall time per step is above the unprofiled one (the row's
``median_ms`` on the CPU); the shares are what to read. Writes ``profile.json`` and ``profile.md`` in ``--out``.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sysconfig
import time
from typing import Any, Callable, Optional

import torch
from pytorch_lightning.callbacks import Callback

__all__ = ["GROUPS", "ProfileSteps", "StepProfiler", "group_of", "render_profile", "summarize_cprofile"]

#: (group, path fragments of its files), first match wins; C functions are charged to their caller's group
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("our callbacks", ("lightning_zerocopy/callbacks/", "lightning_zerocopy/step_logging.py")),
    ("our module", ("lightning_zerocopy/models/",)),
    ("benchmark harness", ("benchmarks/",)),
    ("lightning loop", ("pytorch_lightning/", "lightning_fabric/", "lightning_utilities/")),
    ("torchmetrics", ("torchmetrics/",)),
    ("optimizer", ("torch/optim/",)),
    ("autograd", ("torch/autograd/", "torch/_tensor.py")),
    ("PyG", ("torch_geometric/", "torch_geometric.")),  # "torch_geometric.nn.conv...propagate_*.py": PyG's generated code
    ("torch nn / python", ("torch/",)),
]
TOP = 25


_STDLIB = sysconfig.get_paths()["stdlib"].replace(os.sep, "/")
#: the group of C functions and standard-library code called from another C or standard-library function
UNCLAIMED = "C / stdlib"


def group_of(filename: str) -> str:
    """The group of a Python file (``other`` when no group claims it)."""
    path = filename.replace(os.sep, "/")
    for name, parts in GROUPS:
        if any(p in path for p in parts):
            return name
    return "other"


def _charged_to_caller(filename: str) -> bool:
    """C functions (cProfile's ``~``) and the standard library (``contextlib``, ``inspect``, ``abc``...) do work
    for whoever calls them: their own time counts to the caller's group."""
    path = filename.replace(os.sep, "/")
    return filename == "~" or path.startswith("<frozen") or (path.startswith(_STDLIB) and "-packages/" not in path)


def _label(key: tuple[str, int, str]) -> str:
    filename, line, func = key
    if filename == "~":  # a C function: cProfile names it like "<method 'item' of 'torch._C.TensorBase' objects>"
        return func
    path = filename.replace(os.sep, "/")
    for root in ("site-packages/", "lightning_zerocopy/", "benchmarks/"):
        if root in path:
            path = (root if root != "site-packages/" else "") + path.split(root, 1)[1]
            break
    return f"{path}:{line}({func})"


def summarize_cprofile(profile: cProfile.Profile, steps: int, top: int = TOP) -> dict[str, Any]:
    """Per-step host time by group and the top functions, from a cProfile of ``steps`` steps (µs per step)."""
    stats = pstats.Stats(profile).stats  # key -> (primitive calls, calls, own s, cumulative s, callers)
    groups: dict[str, float] = {}

    def charge(group: str, seconds: float) -> None:
        groups[group] = groups.get(group, 0.0) + seconds

    for key, (_, _, own, _, callers) in stats.items():
        if not _charged_to_caller(key[0]):
            charge(group_of(key[0]), own)
            continue
        charged = 0.0
        for caller, caller_stats in callers.items():  # (pcalls, calls, own s spent for this caller, cumulative)
            charge(UNCLAIMED if _charged_to_caller(caller[0]) else group_of(caller[0]), caller_stats[2])
            charged += caller_stats[2]
        if own > charged + 1e-9:  # called from no profiled Python frame (the profiler's own enable/disable)
            charge(UNCLAIMED, own - charged)
    scale = 1e6 / steps

    def row(key: tuple[str, int, str], value: float) -> dict[str, Any]:
        calls = stats[key][1]
        group = "C call" if key[0] == "~" else "stdlib" if _charged_to_caller(key[0]) else group_of(key[0])
        return {"function": _label(key), "group": group, "us_per_step": value * scale, "calls_per_step": calls / steps}

    by_cum = sorted(stats, key=lambda k: stats[k][3], reverse=True)[:top]
    by_own = sorted(stats, key=lambda k: stats[k][2], reverse=True)[:top]
    return {
        "groups_us": dict(sorted(((g, s * scale) for g, s in groups.items()), key=lambda kv: -kv[1])),
        "python_calls_per_step": sum(v[1] for v in stats.values()) / steps,
        "top_cumulative": [row(k, stats[k][3]) for k in by_cum],
        "top_self": [row(k, stats[k][2]) for k in by_own],
    }


def summarize_torch(prof: Any, steps: int, top: int = TOP) -> dict[str, Any]:
    """Per-step operator figures of a ``torch.profiler`` run over ``steps`` steps (µs per step)."""
    events = prof.key_averages()
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
        "top_ops": [{"op": e.key, "self_us_per_step": e.self_cpu_time_total / steps, "calls_per_step": e.count / steps}
                    for e in ops],  # fmt: skip
    }


class StepProfiler:
    """Profiles the steps ``[warmup, warmup + steps)``: call :meth:`step_start` at the start of every step (first)
    and the step after the last; ``kind``: ``"cprofile"`` or ``"torch"`` (torch.profiler, CPU activity)."""

    def __init__(self, kind: str, warmup: int, steps: int) -> None:
        if kind not in ("cprofile", "torch"):
            raise ValueError(f"StepProfiler kind must be 'cprofile' or 'torch', got {kind!r}")
        self.kind, self.warmup, self.steps = kind, warmup, steps
        self._profiler: Any = None
        self._t0: Optional[float] = None
        self.wall_s: Optional[float] = None
        self.result: Optional[dict[str, Any]] = None

    def step_start(self, index: int) -> None:
        if index == self.warmup:
            if self.kind == "cprofile":
                self._profiler = cProfile.Profile()
            else:
                self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                self._profiler.__enter__()
            self._t0 = time.perf_counter()
            if self.kind == "cprofile":
                self._profiler.enable()
        elif index == self.warmup + self.steps and self._t0 is not None:
            if self.kind == "cprofile":
                self._profiler.disable()
            self.wall_s = time.perf_counter() - self._t0
            if self.kind == "torch":
                self._profiler.__exit__(None, None, None)
            summarize = summarize_cprofile if self.kind == "cprofile" else summarize_torch
            self.result = {f"{self.kind}_ms_per_step": 1e3 * self.wall_s / self.steps, **summarize(self._profiler, self.steps)}
            self._profiler, self._t0 = None, None


class ProfileSteps(Callback):
    """Drives a :class:`StepProfiler` from a Trainer (put it first in ``callbacks``: it starts before the others'
    ``on_train_batch_start``)."""

    def __init__(self, profiler: StepProfiler) -> None:
        self.profiler = profiler

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.profiler.step_start(batch_idx)


def profile_row(train: Callable[[StepProfiler, int], None], warmup: int, steps: int) -> dict[str, Any]:
    """Run ``train(profiler, total_steps)`` once per profiler kind; the row's merged per-step figures."""
    out: dict[str, Any] = {"profile_steps": steps}
    for kind in ("cprofile", "torch"):
        profiler = StepProfiler(kind, warmup, steps)
        train(profiler, warmup + steps + 1)
        if profiler.result is None:
            raise RuntimeError(f"the {kind} profile did not cover steps {warmup}..{warmup + steps} (the run stopped early)")
        out.update(profiler.result)
    return out


# ---------------------------------------------------------------------------------------------- the report
def render_profile(results: dict[str, Any]) -> str:
    """``profile.md``: per model, host µs per step by group for every profiled row, then each row's top items."""
    runs = [r for r in results["runs"] if r.get("status") == "ok" and "profile" in r]
    lines = ["# Host time of a training step, by who spends it", "",
             f"`{results['command']}`; {results['device']}; {len(runs)} profiled rows. µs per step over "
             f"{runs[0]['profile']['profile_steps'] if runs else 0} steps after warm-up. `cProfile ms/step` is the wall "
             "time under cProfile (it inflates Python calls); `unprofiled` is the row's own timing (median; on a GPU "
             "the GPU's step interval). C calls and the standard library count to the group of their caller. In the "
             "operator tables, Lightning runs its closure (forward, backward) inside `Optimizer.step#...`, so that "
             "range's self time holds the closure's Python. On a GPU a host that waits (a full launch queue, a read "
             "back on a logging step) shows the wait as the own time of the call that waits.", ""]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in runs):
        rows = [r for r in runs if r["model"] == model]
        groups = list(dict.fromkeys(g for r in rows for g in r["profile"]["groups_us"]))
        lines += [f"## {model}", "", "| | " + " | ".join(f"`{r['row']}`" for r in rows) + " |",
                  "|---|" + "---:|" * len(rows)]  # fmt: skip
        table = [("unprofiled ms/step", lambda r: f"{r['median_ms']:.3f}"),
                 ("cProfile ms/step", lambda r: f"{r['profile']['cprofile_ms_per_step']:.3f}"),
                 ("torch.profiler ms/step", lambda r: f"{r['profile']['torch_ms_per_step']:.3f}"),
                 ("Python calls/step", lambda r: f"{r['profile']['python_calls_per_step']:.0f}"),
                 ("aten ops/step", lambda r: f"{r['profile']['ops_per_step']:.0f}")]  # fmt: skip
        table += [(f"{g} µs", lambda r, g=g: f"{r['profile']['groups_us'].get(g, 0.0):.0f}") for g in groups]
        lines += [f"| {name} | " + " | ".join(cell(r) for r in rows) + " |" for name, cell in table]
        for r in rows:
            p = r["profile"]
            lines += ["", f"### `{r['row']}` ({model})", "", "| cumulative µs/step | calls/step | group | function |",
                      "|---:|---:|---|---|"]  # fmt: skip
            lines += [f"| {t['us_per_step']:.0f} | {t['calls_per_step']:.1f} | {t['group']} | `{t['function']}` |"
                      for t in p["top_cumulative"]]  # fmt: skip
            lines += ["", "| own µs/step | calls/step | group | function |", "|---:|---:|---|---|"]
            lines += [f"| {t['us_per_step']:.0f} | {t['calls_per_step']:.1f} | {t['group']} | `{t['function']}` |"
                      for t in p["top_self"]]  # fmt: skip
            lines += ["", "| op (torch.profiler) | self CPU µs/step | calls/step |", "|---|---:|---:|"]
            lines += [f"| `{t['op']}` | {t['self_us_per_step']:.0f} | {t['calls_per_step']:.1f} |" for t in p["top_ops"]]
    return "\n".join(lines) + "\n"
