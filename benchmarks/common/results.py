"""Where the benchmarks write their results."""

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
