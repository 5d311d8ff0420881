"""Running a one-model benchmark's rows (``benchmarks.end_to_end.link``, ``benchmarks.end_to_end.hetero``): each row in a process of
its own, the results file rewritten after every row, and the row process's side (:func:`child_main`,
:func:`guarded_row`)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import sys
import time
import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

from benchmarks.common.meta import machine_info
from benchmarks.common.results import write_json
from benchmarks.common.rows import RowUnavailable
from benchmarks.common.sessions import run_script

__all__ = ["child_main", "guarded_row", "out_dir", "run_rows", "start_results", "use_pyg_site"]


def use_pyg_site(site: Optional[str]) -> None:
    """``--pyg-site``: put ``site`` first on this process's import path and on every row process's ``PYTHONPATH``."""
    if site:
        site = os.path.abspath(site)
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)


def out_dir(args: argparse.Namespace, name: str) -> str:
    """The run's output folder (``--out``, default ``results/<name>-<preset>``), created with its ``logs/``."""
    out = os.path.abspath(args.out or os.path.join("results", f"{name}-{args.preset}"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    return out


def start_results(args: argparse.Namespace, rows: Sequence[Any], repo_root: str, module: str,
                  **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A run's results before its graph and rows: the machine, the public flags, the command (``python -m module``
    and this process's arguments), the rows' docs, ``extra`` and no runs yet."""
    public = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return {"meta": machine_info(repo_root, args.cache_dir, args.commit), "args": public,
            "command": " ".join(["python", "-m", module, *sys.argv[1:]]), "rows": {r.name: r.doc for r in rows},
            **extra, "runs": []}  # fmt: skip


def run_rows(rows: Sequence[Any], args: argparse.Namespace, results: dict[str, Any], out: str, start: float, *,
             script: str, repo_root: str, label: str, one_line: Callable[[dict[str, Any]], str],
             precheck: Callable[[Any], Optional[str]], prefix: Callable[[Any], Optional[list[str]]]) -> None:  # fmt: skip
    """Run every row of ``rows`` through ``script`` in a process of its own (``--_run=<row>``, the spec ``args`` and
    the graph's ``kwargs``), behind ``prefix(row)`` (an MPS row's launcher, else None), with ``args.row_timeout_s``;
    a row that ``precheck`` finds unable to run here is skipped with its reason. After every row its result joins
    ``results["runs"]``, a console line (``label: one_line(result)``) is printed and ``out/results.json`` is
    rewritten; at the end ``total_s`` (since ``start``, a ``time.monotonic()``) is added."""
    path = os.path.join(out, "results.json")
    for row in rows:
        why = precheck(row)
        if why is not None:
            result = {"row": row.name, "kind": row.kind, "status": "skipped", "reason": why}
        else:
            t0 = time.monotonic()
            result, why = run_script(script, [f"--_run={row.name}"], {"args": args, "kwargs": results["graph"]["kwargs"]},
                                     os.path.join(out, "logs", f"{row.name}.log"), args.row_timeout_s, repo_root,
                                     prefix(row))  # fmt: skip
            if result is None:
                result = {"row": row.name, "kind": row.kind, "status": "error", "reason": why}
            result["process_s"] = time.monotonic() - t0
        result.setdefault("doc", row.doc)
        results["runs"].append(result)
        print(f"{label}: " + one_line(result), flush=True)
        write_json(path, results, default=str)
    results["total_s"] = time.monotonic() - start
    write_json(path, results, default=str)


def child_main(args: argparse.Namespace, rows: Mapping[str, Any], prepare: Callable[[argparse.Namespace], Any],
               train_module: str) -> None:  # fmt: skip
    """A row process (``--_spec``/``--_result`` set): ``--_run=prepare`` writes ``prepare(spec args)``, any other
    ``--_run`` writes ``<train_module>.run_row(row, spec args, graph kwargs)`` (imported here: the parent process
    never imports the training side)."""
    with open(args._spec, "rb") as f:
        spec = pickle.load(f)
    if args._run == "prepare":
        out: Any = prepare(spec["args"])
    else:
        out = importlib.import_module(train_module).run_row(rows[args._run], spec["args"], spec["kwargs"])
    with open(args._result, "w") as f:
        json.dump(out, f)


def guarded_row(row: Any, args: Any, kwargs: dict[str, Any],
                run: Callable[[Any, Any, dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """``run(row, args, kwargs)``'s figures as a row result (``status`` ok), or the row skipped (``RowUnavailable``)
    or failed (any other exception, with its traceback's tail), after setting ``args.threads`` torch threads."""
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = {"row": row.name, "kind": row.kind, "doc": row.doc}
    try:
        return {**base, "status": "ok", **run(row, args, kwargs)}
    except RowUnavailable as exc:
        return {**base, "status": "skipped", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others' results
        return {**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
