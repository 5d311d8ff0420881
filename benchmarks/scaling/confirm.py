"""``python -m benchmarks.scaling.confirm``: 1 GPU against N GPUs, drift-robust (issue 39's confirming measurement).

The diagnostic call (docs/scaling/h200x2-diag-2026-11-28) showed that the same model on the same pre-staged batches
ran 5.1 to 8.5 ms a step from one run to the next, and that the first runs of a call were slow: a ratio of two runs
taken minutes apart measures that drift as much as any setting. So this module:

* runs one discarded warm-up run first (``--warmup-run``, by default two independent 1-GPU fits at once: it touches
  the graph, the features, both GPUs and a rank's worth of memory per GPU, as every later run does; its figures are
  kept, marked ``warmup``, and count nowhere);
* then ``--repeats`` blocks per model of ``--models`` (in priority order), each block one run of every
  configuration of ``--configs``, interleaved: even blocks in the given order, odd blocks reversed, later ones
  rotated, so that a drift over the call weighs on every configuration alike;
* starts a block only while its first two runs fit ``--deadline-s`` (a lone run holds no ratio), and any later run
  only while a run like it fits;
* takes every ratio inside its block (a configuration against the block's ``1gpu`` run; ``Ngpu`` against
  ``Ngpu-torch``; ``Ngpu-clique`` and ``Ngpu-auto`` against ``Ngpu``) and reports per configuration the median over the blocks of its rates and of its ratios
  (:mod:`.confirm_report`), with the issue's aims against them.

Configurations (``--configs``): ``1gpu`` (the baseline: one rank), ``Ngpu`` (N ranks under ZeroCopyDDPStrategy's
defaults: DDP ``static_graph`` auto and ``gradient_as_bucket_view``), ``Ngpu-torch`` (N ranks with torch's DDP
defaults, both off: the defaults before issue 39), ``Ngpu-clique`` and ``Ngpu-auto`` (as ``Ngpu`` with the ``clique``
or ``auto`` cache policy at the same per-GPU budget; the others use ``--policy``), ``Nx1`` (N independent 1-GPU fits at once, no DDP). Every run is a
fit of :mod:`benchmarks.scaling.diag`'s kind (``--path``: ``worker``, the pipeline worker under MPS as the recipe
runs it; ``off``) with a warm-up epoch, then a ``data`` epoch (the data path) and a ``model`` epoch (the model-only
row: real batches staged on each GPU, replayed), each about ``--phase-s``; DDP's built-in all-reduce (no timing
hook); per-step timelines and CPU figures per rank as the diagnostic's.

Runs that no longer fit ``--deadline-s`` are reported as skipped; the JSON (``--out``) is rewritten after every run, so
a cut call keeps what it measured. Example (the ``scaling_confirm``
stage of ``scripts/gpu_session.sh``; ``--device cpu`` runs the same code on gloo ranks)::

    python -m benchmarks.scaling.confirm --num-nodes 4000000 --configs 1gpu,2gpu-torch,2gpu --repeats 2 \\
        --deadline-s 345 --out results/scaling_confirm.json
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.common.results import write_json  # noqa: E402
from benchmarks.common.sessions import forward_stop_signals, restore_signals  # noqa: E402
from benchmarks.scaling.__main__ import MODELS  # noqa: E402
from benchmarks.scaling.confirm_report import print_summary, summarize  # noqa: E402
from benchmarks.scaling.diag import (  # noqa: E402
    RunSpec,
    add_run_flags,
    check_run_flags,
    prepare_graph,
    run_estimate,
    run_spec,
)
from benchmarks.scaling.knobs import parse_knobs  # noqa: E402
from benchmarks.scaling.report import topology  # noqa: E402

__all__ = ["Config", "block_order", "build_plan", "main", "needed_s", "parse_config", "parse_confirm_args", "run_args"]

_CONFIG = re.compile(r"^(\d+)(gpu|gpu-torch|gpu-clique|gpu-auto|x1)$")
#: the DDP options before issue 39 (torch's defaults), as knobs
TORCH_DDP = "static_graph=0+gradient_as_bucket_view=0"
BASE = "1gpu"


@dataclass(frozen=True)
class Config:
    """A configuration of the comparison: its label, GPU count, independent fits instead of DDP, torch's DDP
    defaults instead of the strategy's."""

    label: str
    gpus: int
    independent: bool = False
    torch_ddp: bool = False
    policy: Optional[str] = None  # the cache policy, where it is not --policy


def parse_config(token: str) -> Config:
    """``1gpu``, ``Ngpu``, ``Ngpu-torch``, ``Ngpu-clique``, ``Ngpu-auto`` or ``Nx1`` (see the module docstring).

    Raises:
        ValueError: another token (the message names ``--configs`` and the forms).
    """
    found = _CONFIG.match(token.strip())
    if found is None or int(found.group(1)) < 1 or (found.group(2) != "gpu" and int(found.group(1)) < 2):
        raise ValueError(f"--configs {token!r}: write 1gpu, Ngpu, Ngpu-torch, Ngpu-clique, Ngpu-auto or Nx1 with N >= 2")
    gpus, kind = int(found.group(1)), found.group(2)
    return Config(token.strip(), gpus, independent=kind == "x1", torch_ddp=kind == "gpu-torch",
                  policy=kind[len("gpu-"):] if kind in ("gpu-clique", "gpu-auto") else None)  # fmt: skip


def block_order(configs: list[Config], block: int) -> list[Config]:
    """The run order of block ``block``: as given in even blocks, reversed in odd ones, rotated by ``block // 2``."""
    order = list(configs) if block % 2 == 0 else list(reversed(configs))
    shift = (block // 2) % max(len(order), 1)
    return order[shift:] + order[:shift]


@dataclass
class PlannedRun:
    """One run of the plan: the diagnostic's run spec, its configuration label, block (``-1``: the warm-up)."""

    spec: RunSpec
    config: str
    block: int
    policy: Optional[str] = None

    @property
    def warmup(self) -> bool:
        return self.block < 0


def _spec(config: Config, model: str, path: str, block: int) -> RunSpec:
    knobs = parse_knobs("comm_timing=0" + ("+" + TORCH_DDP if config.torch_ddp else ""))
    where = "warmup" if block < 0 else f"b{block}"
    return RunSpec(f"{model}-{path}-{config.label}-{where}", "confirm", model, "worker" if path == "worker" else "off",
                   path != "off", config.gpus, independent=config.independent, knobs_label=config.label, knobs=knobs)  # fmt: skip


def build_plan(configs: list[Config], models: list[str], path: str, repeats: int,
               warmup: Optional[Config]) -> list[PlannedRun]:  # fmt: skip
    """The warm-up run, then per model (in order) ``repeats`` blocks of every configuration (:func:`block_order`)."""
    plan = [PlannedRun(_spec(warmup, models[0], path, -1), warmup.label, -1, warmup.policy)] if warmup else []
    for model in models:
        for block in range(repeats):
            plan += [PlannedRun(_spec(c, model, path, block), c.label, block, c.policy) for c in block_order(configs, block)]
    return plan


def parse_confirm_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling.confirm", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="1gpu,2gpu-torch,2gpu", help="the configurations of every block, in the "
                   "order of the even blocks: 1gpu (the baseline), Ngpu, Ngpu-torch, Ngpu-clique, Nx1")
    p.add_argument("--models", default="heavy,light", help="models in priority order, a set of blocks each")
    p.add_argument("--path", default="worker", choices=("worker", "off"), help="the data path of every run")
    p.add_argument("--repeats", type=int, default=2, help="blocks per model")
    p.add_argument("--warmup-run", default="2x1", help="the discarded first run's configuration ('none': no warm-up)")
    add_run_flags(p, "results/scaling_confirm.json", nccl_debug=0)
    args = p.parse_args(argv)
    try:
        check_run_flags(args)
        args.config_list = [parse_config(t) for t in args.configs.split(",") if t.strip()]
        if BASE not in [c.label for c in args.config_list]:
            raise ValueError(f"--configs must hold the baseline {BASE!r} (every ratio is taken against it)")
        args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in args.model_list if m not in MODELS]
        if unknown or not args.model_list:
            raise ValueError(f"--models must name some of {sorted(MODELS)}, got {args.models!r}")
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        warmup = None if args.warmup_run == "none" else parse_config(args.warmup_run)
        args.plan = build_plan(args.config_list, args.model_list, args.path, args.repeats, warmup)
    except ValueError as exc:
        p.error(str(exc))
    return args


def needed_s(done: list[dict[str, Any]], plan: list[PlannedRun], index: int, floor: float) -> float:
    """Seconds the run ``plan[index]`` must find left to start: its own estimate (:func:`~.diag.run_estimate`), and,
    for the first run of a block, the second's too, so that no block starts that could not hold one ratio."""
    planned = plan[index]
    needed = run_estimate(done, planned.spec, floor)
    first = planned.block >= 0 and (index == 0 or plan[index - 1].block != planned.block
                                    or plan[index - 1].spec.model != planned.spec.model)  # fmt: skip
    if first and index + 1 < len(plan) and plan[index + 1].block == planned.block:
        needed += run_estimate(done, plan[index + 1].spec, floor)
    return needed


def run_args(args: argparse.Namespace, planned: PlannedRun) -> argparse.Namespace:
    """``args`` for one planned run: its configuration's cache policy where it has one, else ``--policy``."""
    return argparse.Namespace(**{**vars(args), "policy": planned.policy or args.policy})


def _pairs(configs: list[Config]) -> dict[str, str]:
    """What a configuration is compared with besides ``1gpu``: ``Ngpu -> Ngpu-torch`` (the new DDP defaults against
    the old), ``Ngpu-clique -> Ngpu`` and ``Ngpu-auto -> Ngpu`` (the policy against replicate), where both are
    configured."""
    labels = {c.label for c in configs}
    pairs = {c.label: f"{c.label}-torch" for c in configs if f"{c.label}-torch" in labels}
    pairs.update({c.label: f"{c.gpus}gpu" for c in configs if c.policy in ("clique", "auto") and f"{c.gpus}gpu" in labels})
    return pairs


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_confirm_args(argv)
    start = time.monotonic()
    public = {k: v for k, v in vars(args).items() if k not in ("plan", "config_list")}
    report: dict[str, Any] = {"benchmark": "scaling_confirm", "config": public, "topology": topology(),
                              "plan": [p.spec.name for p in args.plan], "runs": [], "summary": {}}  # fmt: skip
    print("plan (in order): " + ", ".join(report["plan"]), flush=True)
    pairs = _pairs(args.config_list)
    previous = forward_stop_signals()
    try:
        report["graph"] = prepare_graph(args)
        print(f"graph: {args.num_nodes:,} nodes ready in {report['graph']['wall_s']:.0f} s"
              + (f" ({report['graph']['error']})" if "error" in report["graph"] else ""), flush=True)  # fmt: skip
        write_json(args.out, report)
        for i, planned in enumerate(args.plan):
            left = args.deadline_s - (time.monotonic() - start) if args.deadline_s > 0 else float("inf")
            needed = needed_s(report["runs"], args.plan, i, args.min_run_s)
            if left < needed:
                result = {**asdict(planned.spec), "status": "skipped",
                          "reason": f"{left:.0f} s left of --deadline-s, a run like it needs ~{needed:.0f} s"}  # fmt: skip
            else:
                result = run_spec(run_args(args, planned), planned.spec, min(args.timeout, left - 5.0))
            result.update(config=planned.config, block=planned.block, warmup=planned.warmup,
                          started_s=round(time.monotonic() - start - result.get("wall_s", 0.0), 1))  # fmt: skip
            report["runs"].append(result)
            report["summary"] = summarize(report["runs"], BASE, pairs)
            print(_line(result), flush=True)
            write_json(args.out, report)
    finally:
        restore_signals(previous)
        report["total_s"] = time.monotonic() - start
        write_json(args.out, report)
        print_summary(report["summary"])
        print(f"wrote {args.out} ({report['total_s']:.0f} s)", flush=True)
    return report


def _line(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        why = result.get("reason") or (result.get("error") or "")[-1500:]
        return f"{result['name']}: {result['status']} ({result.get('wall_s', 0):.0f} s) {why}"
    phases = ", ".join(f"{p} {sum(f['rank_steps_per_s']) / len(f['rank_steps_per_s']):.1f}"
                       for p, f in result["phases"].items())  # fmt: skip
    return f"{result['name']}: steps/s a rank {phases} ({result['wall_s']:.0f} s)" + (" [warm-up]" if result["warmup"] else "")


if __name__ == "__main__":
    main()
