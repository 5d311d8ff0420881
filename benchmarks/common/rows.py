"""Picking a benchmark's rows by name, shared by the e2e, link and step benchmarks."""

from __future__ import annotations

from typing import Mapping, TypeVar

__all__ = ["RowUnavailable", "pick_rows"]

RowT = TypeVar("RowT")


def pick_rows(names: str, rows: Mapping[str, RowT], option: str) -> list[RowT]:
    """The rows of ``rows`` named in the comma-separated ``names`` (``all``: every row), in the order given.

    Raises:
        ValueError: an unknown name, or none (the message names ``option`` and lists the known rows).
    """
    picked = [n.strip() for n in names.split(",") if n.strip()]
    if picked == ["all"]:
        return list(rows.values())
    unknown = [n for n in picked if n not in rows]
    if unknown or not picked:
        raise ValueError(f"{option}: unknown row(s) {unknown or names!r}; known rows: {', '.join(rows)} (or 'all')")
    return [rows[n] for n in picked]


class RowUnavailable(Exception):
    """This build or machine lacks the row's feature; the row is reported as skipped with this message."""
