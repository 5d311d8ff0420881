"""The command of a one-model benchmark (``python -m benchmarks.end_to_end.link``, ``python -m benchmarks.end_to_end.hetero``): its
parser's frame and checks, its rows by name, a run's scaffolding (the output folder and results, the graph prepared in
a process of its own, every row in a process of its own, the report), ``--list``, ``--report-only`` and a row
process's side. What differs between the benchmarks (rows, presets, their own flags, the graph, the report) comes in
through :class:`OneModelCommand`'s fields."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from benchmarks.common import cli
from benchmarks.common.row_runs import child_main, out_dir, run_rows, start_results, use_pyg_site
from benchmarks.common.rows import pick_rows
from benchmarks.common.sessions import forward_stop_signals, run_script

__all__ = ["OneModelCommand"]


@dataclass(frozen=True)
class OneModelCommand:
    """One benchmark's command: ``label`` prefixes its console lines and names its default output folder
    (``results/<label>-<preset>``); ``python -m <module>`` runs ``script`` (its ``__main__.py``, also run by the row
    processes and the graph's preparation, in ``repo_root``); ``rows`` by name in the report's order, ``presets``
    (dataclasses whose fields are flags); ``prepare(args)`` gives the graph's figures (with its ``kwargs``),
    ``<train_module>.run_row(row, args, kwargs)`` trains a row; ``render(dir)`` writes the report (returns the files),
    ``one_line(result)`` is a row's console line, ``precheck(row)`` why it cannot run here, ``prefix(args, row)`` the
    launcher an MPS row starts behind."""

    label: str
    module: str
    script: str
    repo_root: str
    rows: Mapping[str, Any]
    presets: Mapping[str, Any]
    prepare: Callable[[argparse.Namespace], dict[str, Any]]
    train_module: str
    render: Callable[[str], Sequence[str]]
    one_line: Callable[[dict[str, Any]], str]
    precheck: Callable[[Any], Optional[str]]
    prefix: Callable[[argparse.Namespace, Any], list[str]]

    # ------------------------------------------------------------------------------------------ the command line
    def parser(self, doc: str, default_preset: str, report_only_help: str) -> argparse.ArgumentParser:
        """The parser (description and examples from ``doc``, the module docstring) with the flags every one-model
        benchmark has (:func:`benchmarks.common.cli.add_run_arguments`); the caller adds its own."""
        p = argparse.ArgumentParser(prog=f"python -m {self.module}", description=doc.split("\n\n")[0],
                                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])  # fmt: skip
        cli.add_run_arguments(p, self.presets, default_preset, self.label, report_only_help)
        return p

    def parse(self, p: argparse.ArgumentParser, argv: Optional[list[str]], at_least_one: Iterable[str],
              check: Callable[[argparse.ArgumentParser, argparse.Namespace], None] = lambda p, args: None) -> argparse.Namespace:  # fmt: skip
        """Parse ``argv`` (with a row process's hidden flags), fill the unset flags from the preset, check them
        (``at_least_one``: flags that must be >= 1; ``check``: the benchmark's own checks, exiting through
        ``p.error``), then ``args.fanouts`` and the ``--configs`` rows."""
        cli.add_child_arguments(p)
        args = p.parse_args(argv)
        cli.apply_preset(p, args, self.presets, at_least_one)
        check(p, args)
        cli.parse_fanouts_and_rows(p, args, self.select_rows)
        return args

    def select_rows(self, configs: str) -> list[Any]:
        """The rows named in a comma-separated list (``all``: every row), in the order given (see :func:`pick_rows`)."""
        return pick_rows(configs, self.rows, "--configs")

    # ------------------------------------------------------------------------------------------ a run
    def start(self, args: argparse.Namespace, **extra: Any) -> tuple[list[Any], str, dict[str, Any], float]:
        """A run's rows, output folder, results (the machine, the flags, ``extra``; no graph, no runs yet) and start
        time; ``--pyg-site`` put first on the import paths (the rows' prechecks import from it)."""
        rows = self.select_rows(args.configs)
        use_pyg_site(args.pyg_site)
        out = out_dir(args, self.label)
        return rows, out, start_results(args, rows, self.repo_root, self.module, **extra), time.monotonic()

    def prepare_graph(self, args: argparse.Namespace, out: str, in_process: bool = False) -> dict[str, Any]:
        """The graph's figures, from :attr:`prepare` in a process of its own (no CUDA context may outlive it before
        an MPS row starts) or, ``in_process``, here. Exits with the reason when it fails."""
        if in_process:
            graph, why = self.prepare(args), None
        else:
            graph, why = run_script(self.script, ["--_run=prepare"], {"args": args}, os.path.join(out, "logs", "prepare.log"),
                                    max(args.row_timeout_s, 3600), self.repo_root)  # fmt: skip
        if graph is None:
            raise SystemExit(f"{self.label}: preparing the graph failed: {why}")
        return graph

    def run_rows(self, rows: Sequence[Any], args: argparse.Namespace, results: dict[str, Any], out: str, start: float) -> None:
        """Every row in a process of its own (an MPS row behind its launcher; see
        :func:`benchmarks.common.row_runs.run_rows`), then the report."""
        run_rows(rows, args, results, out, start, script=self.script, repo_root=self.repo_root, label=self.label,
                 one_line=self.one_line, precheck=self.precheck,
                 prefix=lambda row: self.prefix(args, row) if row.mps else None)  # fmt: skip
        self.report(out)

    def report(self, out: str) -> None:
        """Write the report of ``out/results.json`` and say which files."""
        files = self.render(out)
        print(f"{self.label}: wrote {', '.join(os.path.basename(f) for f in files)} in {out}", flush=True)

    def main(self, args: argparse.Namespace, run: Callable[[argparse.Namespace], Any]) -> None:
        """A row process's side (``--_spec``), ``--list``, ``--report-only``, or ``run(args)`` with stop signals
        forwarded to the row processes."""
        if args._spec:
            child_main(args, self.rows, self.prepare, self.train_module)
        elif args.list:
            width = max(len(name) for name in self.rows) + 2
            for row in self.rows.values():
                print(f"{row.name:<{width}}{row.doc}")
        elif args.report_only:
            self.report(args.report_only)
        else:
            forward_stop_signals()
            run(args)
