"""``scripts/diagnostics/hot_rows_share.py``: the share of gathered rows a ``hot_rows`` cache holds."""

from __future__ import annotations

import pytest
from helpers import load_diagnostic



def test_every_row_cached_holds_every_row(tmp_path):
    share = load_diagnostic("hot_rows_share").hot_share(3000, 6.0, 1.0, [5, 3], 64, 3, str(tmp_path))
    assert share["slot_share"] == pytest.approx(1.0) and share["row_share"] == pytest.approx(1.0)


def test_the_most_frequent_fifth_holds_more_than_its_size_and_less_than_all(tmp_path):
    share = load_diagnostic("hot_rows_share").hot_share(3000, 6.0, 0.2, [5, 3], 64, 3, str(tmp_path))
    assert 0.2 < share["slot_share"] < 1.0
    assert 0.2 < share["row_share"] < 1.0
    assert share["rows_per_batch"] > 64
