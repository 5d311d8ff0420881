"""The command-line flags and checks that the one-model benchmarks (``benchmarks.end_to_end.link``, ``benchmarks.end_to_end.hetero``)
share: where a run writes, which rows, the training and measuring budget, the child-process flags, and filling a
run's unset flags from its preset."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

__all__ = ["OneModelPreset", "add_child_arguments", "add_gemm_rows_argument", "add_measuring_arguments", "add_run_arguments",
           "add_step_arguments", "add_target_argument", "apply_preset", "gemm_rows_callbacks", "parse_fanouts_and_rows"]


@dataclass(frozen=True)
class OneModelPreset:
    """The training and measuring part of a one-model benchmark's named run; a benchmark's preset adds its graph's
    fields (keyword-only). Every field is also a command-line flag (:func:`apply_preset` fills the unset ones)."""

    batch_size: int
    num_neighbors: str
    hidden: int
    steps: int
    warmup: int
    val_every: int
    val_batches: int
    row_budget_s: float
    row_timeout_s: float
    configs: str
    pyg_workers: str
    threads: int


def add_run_arguments(p: argparse.ArgumentParser, presets: Iterable[str], default_preset: str, out_name: str,
                      report_only_help: str) -> None:  # fmt: skip
    """``--preset``, ``--configs``, ``--out`` (default ``results/<out_name>-<preset>``), ``--report-only``,
    ``--list``, ``--pyg-site`` and ``--commit``."""
    p.add_argument("--preset", choices=sorted(presets), default=default_preset, help="graph size, steps and budgets (below override it)")
    p.add_argument("--configs", help="comma-separated rows, or 'all' (default: the preset's)")
    p.add_argument("--out", help=f"output folder (default: results/{out_name}-<preset>)")
    p.add_argument("--report-only", metavar="DIR", help=report_only_help)
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--pyg-site", metavar="DIR", help="a folder with pyg-lib or torch-sparse, put first on every row's "
                   "import path (the GPU box: where .pyg/*.tgz is unpacked)")  # fmt: skip
    p.add_argument("--commit", default=os.environ.get("GPU_CHECK_COMMIT"), help="the tree's commit for the report")


def add_step_arguments(t: Any) -> None:
    """``--steps``, ``--warmup``, ``--val-every`` and ``--val-batches`` (their defaults: the preset's)."""
    t.add_argument("--steps", type=int)
    t.add_argument("--warmup", type=int)
    t.add_argument("--val-every", type=int)
    t.add_argument("--val-batches", type=int)


def add_target_argument(t: Any, name: str, words: str) -> None:
    """``--target-<name>``: the validation ``words`` (e.g. ``accuracy``) the time-to-target column counts to."""
    t.add_argument(f"--target-{name}", type=float, help=f"time-to-{words} target (default: 95%% of the lowest best "
                   f"validation {words} among the rows, decided when the report is written)")  # fmt: skip


def add_measuring_arguments(t: Any, loader: str, stage_batches: int, parse_share: Callable[[str], Any]) -> None:
    """Threads, optimizer, seed, budgets, PyG's worker sweep (``loader``: the PyG loader's name), model-only staging
    (``stage_batches``: the default count) and the MPS rows' worker share (read by ``parse_share``)."""
    t.add_argument("--threads", type=int, help="torch threads per row process (0: torch's default)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--row-budget-s", type=float, help="stop a row's training after this many seconds (0: none)")
    t.add_argument("--row-timeout-s", type=float, help="kill a row's process after this many seconds")
    t.add_argument("--pyg-workers", help=f"{loader} worker counts to sweep; the best trains")
    t.add_argument("--sweep-batches", type=int, default=30, help="batches timed per worker count of the sweep")
    t.add_argument("--stage-batches", type=int, default=stage_batches, help="model_only: distinct batches pre-staged on the device")
    t.add_argument("--worker-sm-percent", type=parse_share, default=10, help="MPS rows: the pipeline worker's share of "
                   "SMs, 1-99 or auto (PipelineCallback(worker_sm_percent='auto'))")  # fmt: skip
    add_gemm_rows_argument(t)


def add_gemm_rows_argument(t: Any, default: int = 0) -> None:
    """``--gemm-rows N``: every row's model under ``GemmRowBuckets(multiple=N)``, PyG's and model-only's included (the
    same model on each): its linear products on row counts rounded up to N (cuBLAS's per-shape host setup); 0: off."""
    t.add_argument("--gemm-rows", type=int, default=default, help="every row's model under GemmRowBuckets(multiple=N), "
                   f"PyG's included: its linear products on row counts rounded up to N; 0: off (default {default})")


def gemm_rows_callbacks(rows: Any) -> list[Any]:
    """What ``--gemm-rows N`` adds to a row's trainer callbacks: ``[GemmRowBuckets(N)]``, or none for 0 (off)."""
    from lightning_zerocopy.callbacks import GemmRowBuckets  # the sweep's parent process imports this module

    rows = int(rows or 0)
    return [GemmRowBuckets(rows)] if rows else []


def add_child_arguments(p: argparse.ArgumentParser) -> None:
    """The hidden flags of a row's own process (:func:`benchmarks.common.row_runs.child_main`)."""
    p.add_argument("--_run", help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)


def apply_preset(p: argparse.ArgumentParser, args: argparse.Namespace, presets: Mapping[str, Any],
                 at_least_one: Iterable[str]) -> None:  # fmt: skip
    """Fill the flags left unset from ``args.preset`` (every field of the preset dataclass), then check them (exits
    through ``p.error``): the ``at_least_one`` flags are >= 1 and ``--warmup`` is in ``[0, --steps)``."""
    preset = presets[args.preset]
    for field in dataclasses.fields(preset):
        if getattr(args, field.name) is None:
            setattr(args, field.name, getattr(preset, field.name))
    for name in at_least_one:
        value: Union[int, float] = getattr(args, name)
        if value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps), got {args.warmup} with --steps {args.steps}")


def parse_fanouts_and_rows(p: argparse.ArgumentParser, args: argparse.Namespace, select_rows: Callable[[str], Any]) -> None:
    """Set ``args.fanouts`` from ``--num-neighbors`` and check that ``--configs`` names known rows (exits through
    ``p.error``)."""
    try:
        args.fanouts = [int(f) for f in str(args.num_neighbors).split(",")]
        select_rows(args.configs)
    except ValueError as exc:
        p.error(str(exc))
