"""cache_budget: parsing sizes and shares, resolving against free memory, bad input."""

from __future__ import annotations

import warnings

import pytest

from lightning_zerocopy.cache.budget import format_bytes, parse_budget, resolve_budget


@pytest.mark.parametrize(
    ("text", "kind", "amount"),
    [
        ("8GiB", "bytes", 8 * 2**30),
        ("8 gib", "bytes", 8 * 2**30),
        ("1.5GB", "bytes", 1.5e9),
        ("512MiB", "bytes", 512 * 2**20),
        ("100", "bytes", 100),
        (4096, "bytes", 4096),
        (0, "bytes", 0),
        ("0", "bytes", 0),
        ("40%", "fraction", 0.4),
        ("100%", "fraction", 1.0),
        ("0.5%", "fraction", 0.005),
    ],
)
def test_parse(text, kind, amount) -> None:
    spec = parse_budget(text)
    assert spec.kind == kind
    assert spec.amount == pytest.approx(amount)
    assert spec.is_zero == (amount == 0)


@pytest.mark.parametrize("bad", ["-1GiB", "8 parsecs", "GiB", "", "40 %%", "101%", -5, 1.5, True, None, [1]])
def test_bad_budgets_name_the_key(bad) -> None:
    with pytest.raises(ValueError, match="cache_budget"):
        parse_budget(bad)


def test_share_of_free_memory() -> None:
    assert resolve_budget(parse_budget("40%"), free_bytes=1000) == 400


def test_byte_budget_within_free_memory_is_kept() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_budget(parse_budget("1KiB"), free_bytes=10 * 2**10) == 1024


def test_byte_budget_above_free_memory_is_clamped_with_the_amount() -> None:
    free = 4 * 2**30
    with pytest.warns(UserWarning, match=r"cache_budget='8GiB'.*clamped by 4\.40 GiB to 3\.60 GiB"):
        assert resolve_budget(parse_budget("8GiB"), free_bytes=free) == int(0.9 * free)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
