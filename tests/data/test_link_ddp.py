"""A link DataModule under several CPU ranks (gloo, jobs launched by ``scripts/link_ddp_script.py``): on both graph
kinds (``kind``: ``helpers.kinds``) one host copy per machine built by local rank 0 and mapped by the others, disjoint
equal shares of the supervised edges, telemetry and predictions merged by rank 0; for the typed graph predictions
bitwise equal to one rank's and a resume on another world size that trains each positive edge of the interrupted
epoch once; ``ZeroCopyDDPStrategy`` with a cache takes link builders, other host-memory consumers are refused in one
line before any data is built."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from helpers.ddp_jobs import rank_reports, run_ddp_script, shm_names
from helpers.hetero_link import small_graph
from helpers.kinds import LINK_KINDS
from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.datasets import SyntheticHeteroLinkGraph
from lightning_zerocopy.options import RecipeError
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "link_ddp_script.py"
UNTYPED, TYPED = LINK_KINDS
BATCH_SIZE = 32  # the script's, of the typed kind (the untyped: 64)



def _graph(cache: str) -> SyntheticHeteroLinkGraph:
    """The script's graph: 200 users, 100 items, 4 fixed negatives per val/test positive."""
    return small_graph(cache, num_users=200, num_items=100, avg_ratings=5.0, neg_per_positive=4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The dataset cache of every run of this module (the graph generated once)."""
    path = str(tmp_path_factory.mktemp("hetero-link-ddp-cache"))
    _graph(path).prepare()
    return path


@pytest.fixture(scope="module")
def one_rank_predictions(cache: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """``predictions.npz`` of one rank (what two ranks must give, bitwise)."""
    out = _run(tmp_path_factory.mktemp("one-rank"), "one", cache, devices=1, stage="predict", eval_batch_size=16)
    return dict(np.load(out / "predictions.npz"))


def _run(tmp_path: Path, name: str, cache: str, **config: Any) -> Path:
    """Run the script with ``config`` (its ``out`` is ``tmp_path/name``, the dataset cache ``cache``); the output
    folder."""
    return run_ddp_script(SCRIPT, tmp_path, name, cache, **config)



def _edges(report: dict[str, Any], epoch: int, before_step: int = 1 << 30) -> list[int]:
    """Positions (in the train split) of the positive edges of ``report``'s batches of ``epoch`` before a step."""
    return [i for e, step, _, input_id, _ in report["batches"] if e == epoch and step < before_step for i in input_id]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "strategy", "cache_budget"), [
    (TYPED, "ddp", 0), (TYPED, "zerocopy_ddp", 0), (TYPED, "zerocopy_ddp", "4KiB"), (UNTYPED, "zerocopy_ddp", "2KiB"),
], ids=str)  # fmt: skip
def test_two_ranks_map_one_host_copy_and_train_disjoint_equal_edge_shares(
    tmp_path: Path, cache: str, kind, strategy: str, cache_budget: Any
) -> None:
    """With a ``cache_budget`` too: both ranks decide the Strategy's cache (degree ranking; CPU ranks place nothing)
    from the link plan and train as without it; the ranks' epoch figures reach the logger and rank 0 merges both
    ranks' predictions."""
    before = shm_names()
    out = _run(tmp_path, "fit", cache, kind=str(kind).split("-")[0], devices=2, strategy=strategy,
               cache_budget=cache_budget, cache_ranking="degree", stage="fit_predict", telemetry=True,
               limit_val_batches=2)  # fmt: skip
    reports = rank_reports(out, 2)
    assert [r["world_size"] for r in reports] == [2, 2] and reports[0]["pid"] != reports[1]["pid"]

    # one set of segments: every rank maps all of them (each edge type's CSC, each featured type's table, the link
    # splits' tensors), and every one was created by rank 0 (the creator's pid is in the name)
    paths = reports[0]["paths"]
    assert len(paths) >= (2 * 2 + 2 if kind.typed else 2 + 1) + 5  # CSCs, feature tables, train/val/test edges
    for report in reports:
        assert report["paths"] == paths and report["mapped"] == paths
    assert all(os.path.basename(p).startswith(f"lzc-{reports[0]['pid']}-") for p in paths), paths

    # disjoint, equal shares of the train split's positive edges (drop_last: less than a batch per rank left out),
    # each batch's positives the train edges at its input_id, read through each endpoint type's n_id
    batch_size = BATCH_SIZE if kind.typed else 64
    train = [tuple(p) for p in reports[0]["train_pairs"]]
    assert reports[1]["train_pairs"] == reports[0]["train_pairs"]
    for report in reports:
        assert len(report["batches"]) == report["steps_per_epoch"] > 1
        for *_, input_id, pairs in report["batches"]:
            assert len(input_id) == batch_size and [train[i] for i in input_id] == [tuple(p) for p in pairs]
    shares = [_edges(r, 0) for r in reports]
    assert len(shares[0]) == len(shares[1]) == len(set(shares[0])) and not set(shares[0]) & set(shares[1])
    assert len(train) - len(shares[0]) - len(shares[1]) < 2 * batch_size
    assert all((r["cache_rows"] > 0) == bool(cache_budget) for r in reports)  # the strategy planned from the link plan
    assert all("data/stall_frac_epoch" in r["logged"] for r in reports)  # telemetry reached the logger (epoch figures)

    p = np.load(out / "predictions.npz")  # rank 0 merged both shares
    assert {"src", "dst", "score", "label", "query"} <= set(p.files) and len(p["src"]) > 0
    assert ("edge_type" in p.files) == kind.typed and not list(out.glob("predictions.rank*.npz"))
    pids = {str(r["pid"]) for r in reports}
    left = {n for n in shm_names() - before if any(n.startswith(f"lzc-{pid}-") for pid in pids)}
    assert not left, left


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "eval_batch_size"), [("ddp", 16), ("zerocopy_ddp", 7)])
def test_predictions_on_two_ranks_are_one_ranks_bitwise(tmp_path: Path, cache: str, one_rank_predictions: dict,
                                                         strategy: str, eval_batch_size: int) -> None:  # fmt: skip
    """``predictions.npz`` merged by rank 0 of two ranks is bitwise the file of one rank (node-keyed evaluation per
    type: an edge's sampled endpoints do not depend on its batch or rank), with the ``edge_type``."""
    one = one_rank_predictions
    assert str(one["edge_type"]) == "user__rates__item"
    test = _graph(cache).load().splits["test"]
    assert one["src"].shape == (test.num_positives * 5,)  # each positive and its 4 negatives, once
    out = _run(tmp_path, "two", cache, devices=2, strategy=strategy, stage="predict", eval_batch_size=eval_batch_size)
    two = dict(np.load(out / "predictions.npz"))
    assert sorted(two) == sorted(one)
    for key in one:
        assert np.array_equal(two[key], one[key]), (strategy, eval_batch_size, key)


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after", "epoch_step"), [(1, 2, 7), (2, 1, 4)])
def test_resume_on_another_world_size_trains_each_edge_of_the_epoch_once(tmp_path: Path, cache: str, before: int,
                                                                         after: int, epoch_step: int) -> None:  # fmt: skip
    """Before the link plan dealt its edge positions on a resume, the remainder was computed over the split's
    distinct endpoints as if they were the epoch's seeds (node items, no link fields); here that left nothing, and the
    resumed run trained none of the epoch's remaining edges."""
    positives = _graph(cache).load().splits["train"].num_positives
    step = -(-positives // before // BATCH_SIZE) + epoch_step  # epoch 1, after `epoch_step` batches
    first_out = _run(tmp_path, "first", cache, devices=before, max_epochs=2, drop_last=False, every_n_steps=step)
    first = rank_reports(first_out, before)
    assert step == first[0]["steps_per_epoch"] + epoch_step
    ckpt = tmp_path / "first" / "ckpt" / f"step={step}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(ckpt.parent))
    resumed_out = _run(tmp_path, "resumed", cache, devices=after, max_epochs=3, drop_last=False, ckpt=str(ckpt))
    resumed = rank_reports(resumed_out, after)

    epoch_edges = {i for r in first for i in _edges(r, 1)}
    trained = [i for r in first for i in _edges(r, 1, epoch_step)] + [i for r in resumed for i in _edges(r, 1)]
    counts = Counter(trained)
    assert set(counts) == epoch_edges and max(counts.values()) == 1  # nothing skipped, nothing twice
    train = [tuple(p) for p in resumed[0]["train_pairs"]]
    for report in resumed:  # the resumed batches are link batches of those edges
        for *_, input_id, pairs in report["batches"]:
            assert [train[i] for i in input_id] == [tuple(p) for p in pairs]
    epoch1 = [b for b in resumed[0]["batches"] if b[0] == 1]
    assert epoch1[0][2] == step and epoch1[-1][1] == resumed[0]["steps_per_epoch"] - 1
    assert {i for r in resumed for i in _edges(r, 2)} == set(range(len(train)))  # the new world's own epoch


def test_the_strategy_with_a_cache_takes_link_builders_and_other_consumers_are_refused(tmp_path: Path) -> None:
    """A ``cache_budget`` is taken (the Strategy's cache over typed rows); a host-memory consumer that does not take
    typed builders is refused in one line before any rank starts (``presample`` ranking over link batches:
    tests/strategies/test_presample.py)."""
    strategy = ZeroCopyDDPStrategy(cache_budget="1KiB", cache_ranking="presample")
    dm = ZeroCopyHeteroLinkDataModule(small_graph(str(tmp_path)), num_neighbors=[2, 2], batch_size=4, num_threads=1)
    strategy._preflight(SimpleNamespace(strategy=strategy, callbacks=[]), dm)  # no error

    class OneTableConsumer:  # a host-memory consumer that does not say it takes typed builders
        def attach_host_memory(self, trainer: Any, datamodule: Any) -> None:
            raise AssertionError("not reached")

    with pytest.raises(RecipeError) as refused:  # what the launcher asks before it starts a rank
        strategy._preflight(SimpleNamespace(strategy=strategy, callbacks=[OneTableConsumer()]), dm)
    message = str(refused.value)
    assert "\n" not in message and "OneTableConsumer" in message
