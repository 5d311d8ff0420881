"""Where the benchmarks write their results, and their reports' plots where matplotlib is missing."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional


def write_json(path: str, report: Any, default: Optional[Callable[[Any], Any]] = None) -> None:
    """``report`` as indented JSON at ``path``, creating its folder (``default``: as for :func:`json.dump`)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, default=default)


def read_results(out_dir: str) -> dict[str, Any]:
    """``out_dir/results.json``, for ``--report-only`` re-rendering.

    Raises:
        FileNotFoundError: no ``results.json`` in ``out_dir`` (the message names ``--report-only``).
    """
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--report-only {out_dir}: no results.json there")
    with open(path) as f:
        return json.load(f)


def plots_or_note(write_plots: Callable[[], list[str]], what: str, module: str, out_dir: str) -> tuple[list[str], str]:
    """The files ``write_plots()`` writes and no note, or, where matplotlib is missing, none and a note for the report
    saying how to render ``what`` (``Plot``, ``Plots``): ``python -m <module> --report-only <out_dir>``."""
    try:
        return write_plots(), ""
    except ImportError as exc:  # matplotlib missing
        return [], (f"{what} not rendered here ({exc}): `pip install matplotlib`, then "
                    f"`python -m {module} --report-only {out_dir}`.")  # fmt: skip
