"""The cache decision over one table, pinned bit for bit: a grid of inputs (table sizes, row widths, budgets around
the row lookup and the whole table, rankings, machines, policies, measured read rates) decided on every rank, and the
plans (their digests: rows, shards, bounds), groups, layouts, bytes and hit rates compared with
``fixtures/one_type_decisions.json``, which the one-table ``decide_cache`` wrote before the typed and untyped
decisions became one (``python tests/cache/test_one_type_decision.py --write`` rewrites it: only for a deliberate
change of the decision)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from lightning_zerocopy.cache.decide import RankFacts, decide_cache, needs_read_rates
from lightning_zerocopy.cache.plan import lookup_bytes
from lightning_zerocopy.cache.ranking import CacheScores
from lightning_zerocopy.cache.read_rates import ReadRates
from lightning_zerocopy.graph.schema import NODE

FIXTURE = Path(__file__).parent / "fixtures" / "one_type_decisions.json"
RATES = {"none": None, "nvlink": ReadRates(local=1500.0, peer=200.0, host=20.0),
         "slow": ReadRates(local=1500.0, peer=8.0, host=20.0)}  # fmt: skip
#: machines as (node of each rank, peer-access matrix of each node, CUDA ranks)
MACHINES = {
    "one": ([0], [[[True]]], True),
    "pair": ([0, 0], [[[True, True], [True, True]]], True),
    "pair-no-peer": ([0, 0], [[[True, False], [False, True]]], True),
    "two-pairs": ([0, 0, 0, 0], [[[i // 2 == j // 2 for j in range(4)] for i in range(4)]], True),
    "three-and-one": ([0, 0, 0, 0], [[[i < 3 and j < 3 or i == j for j in range(4)] for i in range(4)]], True),
    "two-nodes": ([0, 0, 1, 1], [[[True, True], [True, True]]] * 2, True),
    "cpu-pair": ([0, 0], [[[True, False], [False, True]]], False),
}


def _facts(machine: str, budget: int) -> list[RankFacts]:
    nodes, peers, cuda = MACHINES[machine]
    facts, local = [], {}
    for rank, node in enumerate(nodes):
        i = local[node] = local.get(node, -1) + 1
        facts.append(RankFacts(rank, node, i, i if cuda else None, budget, peers[node] if i == 0 else None))
    return facts


def _scores(kind: str, n: int, seed: int) -> CacheScores:
    g = torch.Generator().manual_seed(seed)
    if kind == "steep":
        return CacheScores(torch.arange(n, 0, -1, dtype=torch.int64))
    if kind == "ties":
        return CacheScores(torch.randint(0, 4, (n,), generator=g))
    if kind == "zeros":
        return CacheScores(torch.zeros(n, dtype=torch.int64))
    if kind == "random":
        return CacheScores(torch.randint(0, 1000, (n,), generator=g))
    prior = torch.randint(0, 50, (n,), generator=g)
    if kind == "presample-empty":
        return CacheScores(prior, torch.zeros(2, n, dtype=torch.int64))
    weights = torch.rand(n, generator=g, dtype=torch.float64) ** 4 + 1e-3
    halves = torch.stack([torch.bincount(torch.multinomial(weights, 4 * n, replacement=True, generator=g),
                                         minlength=n) for _ in range(2)])  # fmt: skip
    return CacheScores(prior, halves)


def _budget(where: str, n: int, row_bytes: int, shards: int) -> int:
    lookup = lookup_bytes(n, shards)
    whole = lookup + -(-n // shards) * row_bytes
    return {"zero": 0, "below-lookup": lookup - 1, "lookup": lookup, "one-row": lookup + row_bytes,
            "almost-one-row": lookup + row_bytes - 1, "few-rows": lookup + 3 * row_bytes + 5,
            "third": lookup + (n // 3) * row_bytes, "almost-whole": whole - 1, "whole": whole,
            "roomy": 10 * whole}[where]  # fmt: skip


def cases() -> list[dict[str, Any]]:
    """The grid: a seeded sample of every combination, plus the whole-table and nothing-fits edges on each machine."""
    g = torch.Generator().manual_seed(37)
    axes = {
        "n": [1, 7, 64, 1000, 3000],
        "row_bytes": [4, 12, 16, 400],
        "scores": ["steep", "ties", "zeros", "random", "presample", "presample-empty"],
        "budget": ["zero", "below-lookup", "lookup", "almost-one-row", "one-row", "few-rows", "third",
                   "almost-whole", "whole", "roomy"],  # fmt: skip
        "shards": [1, 2],
        "machine": list(MACHINES),
        "policy": ["replicate", "clique", "auto"],
        "rates": list(RATES),
    }
    out = []
    for i in range(160):
        case = {k: v[int(torch.randint(0, len(v), (1,), generator=g))] for k, v in axes.items()}
        out.append(dict(case, seed=i))
    for machine in MACHINES:
        for budget in ("whole", "almost-whole", "below-lookup"):
            for policy in ("clique", "auto"):
                out.append(dict(n=1000, row_bytes=16, scores="random", budget=budget, shards=2, machine=machine,
                                policy=policy, rates="nvlink", seed=1000 + len(out)))  # fmt: skip
    return out


def _note(note: str) -> str:
    """The layout's note; that the hot rows fit one GPU (``auto`` replicates) as a mark: its wording gives bytes now,
    rows then."""
    return "<the hot rows fit one GPU>" if "fit one GPU" in note else note


def digest(record: dict[str, Any]) -> str:
    """A hash of a :func:`record` (what the fixture keeps, beside a few readable figures)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]


def readable(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of rank 0 the fixture keeps in the clear: rows cached, policy, expected hit rate."""
    return {"cached": record["cached"][0], "policy": record["policy"][0], "expected": record["expected"][0]}


def _hex(x: float) -> str:
    return "nan" if math.isnan(x) else float(x).hex()


def record(case: dict[str, Any]) -> dict[str, Any]:
    """What every rank decides for ``case`` (plans as digests), JSON-ready and exact (floats in hex)."""
    n, row_bytes = case["n"], case["row_bytes"]
    scores = _scores(case["scores"], n, case["seed"])
    facts = _facts(case["machine"], _budget(case["budget"], n, row_bytes, case["shards"]))
    rates: Optional[dict] = None if RATES[case["rates"]] is None else {f.rank: RATES[case["rates"]] for f in facts}
    decisions = [_decide(f.rank, facts, scores, n, row_bytes, case["policy"], rates) for f in facts]
    first = decisions[0]
    choice = first.prior_weight
    return {
        "needs_read_rates": _needs_read_rates(case["policy"], facts, scores, n, row_bytes),
        "digests": [_plan(d).digest for d in decisions],
        "cached": [_plan(d).num_cached for d in decisions],
        "groups": [list(d.group) for d in decisions],
        "shards": [d.shard_index for d in decisions],
        "policy": [d.layout.policy for d in decisions],
        "layout_groups": [[list(g) for g in d.layout.groups] for d in decisions],
        "notes": [_note(d.layout.note) for d in decisions],
        "bytes_per_gpu": [d.bytes_per_gpu for d in decisions],
        "budget_bytes": first.budget_bytes,
        "expected": [_hex(d.expected_hit_rate) for d in decisions],
        "in_sample": [_hex(d.in_sample_hit_rate) for d in decisions],
        "prior_weight": None if choice is None else [choice.index, [_hex(r) for r in choice.heldout_hit_rates]],
    }


# ---- the decision over one type (the fixture was written by the one-table decision these replace) ---------------


def _decide(me, facts, scores, n, row_bytes, policy, rates):
    return decide_cache(me, facts, {NODE: scores}, {NODE: n}, {NODE: row_bytes}, policy, read_rates=rates)


def _needs_read_rates(policy, facts, scores, n, row_bytes) -> bool:
    return needs_read_rates(policy, facts, {NODE: scores}, {NODE: n}, {NODE: row_bytes})


def _plan(decision):
    assert set(decision.plans) == {NODE}
    return decision.plans[NODE]


# ---- the test ---------------------------------------------------------------------------------------------------


def _fixture() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("index", range(len(cases())))
def test_one_table_decisions_are_those_of_the_fixture(index: int) -> None:
    expected = _fixture()[index]
    case = cases()[index]
    assert expected["case"] == case, "the grid changed: the fixture no longer describes these inputs"
    now = record(case)
    assert readable(now) == expected["readable"], (case, now)
    assert digest(now) == expected["digest"], (case, now)


def test_the_grid_covers_every_outcome() -> None:
    """The grid holds whole tables, nothing cached, partial caches, cliques, priced choices and presample choices,
    so that the comparison above means something."""
    records = [record(c) for c in cases()]
    assert any(all(c == 0 for c in r["cached"]) for r in records)
    assert any(r["prior_weight"] is not None for r in records)
    assert any("clique" in r["policy"] for r in records) and any("replicate" in r["policy"] for r in records)
    assert any(any(n.startswith("auto: clique reads") for n in r["notes"]) for r in records)
    assert any(any(n.startswith("auto: replicate reads") for n in r["notes"]) for r in records)
    assert any(any("fit one GPU" in n for n in r["notes"]) for r in records)
    assert any(r["needs_read_rates"] for r in records) and not all(r["needs_read_rates"] for r in records)
    assert any(r["expected"][0] == _hex(1.0) for r in records)  # a whole table


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.parent.mkdir(exist_ok=True)
    records = [(c, record(c)) for c in cases()]
    lines = [json.dumps({"case": c, "readable": readable(r), "digest": digest(r)}) for c, r in records]
    FIXTURE.write_text("[\n" + ",\n".join(lines) + "\n]\n")
