"""A node DataModule under several CPU ranks (gloo, jobs launched by ``scripts/ddp_script.py``): on both graph kinds
(``kind``: ``helpers.kinds``) one host copy per machine built by local rank 0 and mapped by the others, disjoint equal
shares of the input type's training seeds; for the typed graph predictions bitwise equal to one rank's, a resume on
another world size; ``ZeroCopyDDPStrategy`` runs it without a cache and with one over typed rows (decided alike on
both ranks; CPU ranks place nothing); another host-memory consumer is refused in one line before any rank starts."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from helpers.ddp_jobs import rank_reports, run_ddp_script, shm_names
from helpers.hetero import TinyHeteroDataset
from helpers.kinds import NODE_KINDS
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.options import RecipeError
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "ddp_script.py"
UNTYPED, TYPED = NODE_KINDS
BATCH_SIZE = 16  # the script's, of the typed kind (the untyped: 64)



def _run(tmp_path: Path, name: str, **config: Any) -> Path:
    """Run the script with ``config`` (its ``out`` is ``tmp_path/name``, the dataset cache shared by the runs of a
    test); the output folder."""
    return run_ddp_script(SCRIPT, tmp_path, name, str(tmp_path / "cache"), **config)



@pytest.mark.slow
@pytest.mark.parametrize(("kind", "strategy"), [(TYPED, "ddp"), (TYPED, "zerocopy_ddp"), (UNTYPED, "ddp")], ids=str)
def test_two_ranks_map_one_host_copy_and_train_disjoint_equal_seed_shares(tmp_path: Path, kind, strategy: str) -> None:
    before = shm_names()
    reports = rank_reports(_run(tmp_path, "fit", kind=str(kind), devices=2, strategy=strategy, cache_budget=0), 2)
    assert [r["world_size"] for r in reports] == [2, 2] and reports[0]["pid"] != reports[1]["pid"]

    # one set of segments: every rank maps all of them (each edge type's CSC, each featured type's table, labels,
    # splits), and every one was created by rank 0 (the creator's pid is in the name), so rank 1 opened rank 0's
    paths = reports[0]["paths"]
    assert len(paths) == (2 * 7 + 2 if kind.typed else 2 + 1) + 1 + 3  # typed: 7 edge types (the MAG shape), 2 tables
    for report in reports:
        assert report["paths"] == paths and report["mapped"] == paths
    assert all(os.path.basename(p).startswith(f"lzc-{reports[0]['pid']}-") for p in paths), paths

    # disjoint, equal shares of the input type's training split (drop_last: less than a batch per rank left out)
    shares = [[s for _, _, _, seeds in r["batches"] for s in seeds] for r in reports]
    assert len(reports[0]["batches"]) == len(reports[1]["batches"]) == reports[0]["steps_per_epoch"] > 1
    assert len(shares[0]) == len(shares[1]) and not set(shares[0]) & set(shares[1])
    train = set(reports[0]["train_idx"])
    assert reports[1]["train_idx"] == reports[0]["train_idx"]
    assert set(shares[0]) | set(shares[1]) <= train
    assert len(train) - len(shares[0]) - len(shares[1]) < 2 * (BATCH_SIZE if kind.typed else 64)

    pids = {str(r["pid"]) for r in reports}
    left = {n for n in shm_names() - before if any(n.startswith(f"lzc-{pid}-") for pid in pids)}
    assert not left, left


@pytest.mark.slow
def test_predictions_on_two_ranks_are_one_ranks_bitwise(tmp_path: Path) -> None:
    """``predictions.npz`` merged by rank 0 of two ranks is bitwise the file of one rank (node-keyed evaluation per
    type: a paper's sample does not depend on its batch or rank), with the seeds' ``node_type``."""
    one = dict(np.load(_run(tmp_path, "one", devices=1, stage="predict", eval_batch_size=32) / "predictions.npz"))
    assert str(one["node_type"]) == "paper"
    assert one["node_id"].shape[0] == 60 and np.array_equal(one["node_id"], np.sort(one["node_id"]))  # 20 % test
    for devices, strategy, eval_batch_size in [(2, "ddp", 32), (2, "zerocopy_ddp", 7)]:
        out = _run(tmp_path, f"{strategy}-{eval_batch_size}", devices=devices, strategy=strategy, stage="predict",
                   eval_batch_size=eval_batch_size)  # fmt: skip
        two = dict(np.load(out / "predictions.npz"))
        assert sorted(two) == sorted(one)
        for key in one:
            assert np.array_equal(two[key], one[key]), (strategy, eval_batch_size, key)


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after", "epoch_step"), [(1, 2, 6), (2, 1, 3)])
def test_resume_on_another_world_size_trains_each_seed_of_the_epoch_once(tmp_path: Path, before: int, after: int,
                                                                         epoch_step: int) -> None:  # fmt: skip
    first = rank_reports(_run(tmp_path, "first", devices=before, max_epochs=2, drop_last=False, every_n_steps=3), before)
    step = first[0]["steps_per_epoch"] + epoch_step  # epoch 1, after `epoch_step` batches
    ckpt = tmp_path / "first" / "ckpt" / f"step={step}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(ckpt.parent))
    resumed = rank_reports(_run(tmp_path, "resumed", devices=after, max_epochs=3, drop_last=False, ckpt=str(ckpt)), after)

    epoch_seeds = {s for r in first for e, _, _, seeds in r["batches"] if e == 1 for s in seeds}
    trained_before = [s for r in first for e, i, _, seeds in r["batches"] if e == 1 and i < epoch_step for s in seeds]
    trained_after = [s for r in resumed for e, _, _, seeds in r["batches"] if e == 1 for s in seeds]
    counts = Counter(trained_before + trained_after)
    assert set(counts) == epoch_seeds and max(counts.values()) == 1  # nothing skipped, nothing twice
    epoch1 = [b for b in resumed[0]["batches"] if b[0] == 1]
    assert epoch1[0][2] == step and epoch1[-1][1] == resumed[0]["steps_per_epoch"] - 1
    epoch2 = {s for r in resumed for e, _, _, seeds in r["batches"] if e == 2 for s in seeds}
    assert epoch2 == set(resumed[0]["train_idx"])  # the new world's own epoch


def test_the_strategy_with_a_cache_takes_heterogeneous_builders_and_other_consumers_are_still_refused() -> None:
    strategy = ZeroCopyDDPStrategy(cache_budget="1KiB")
    assert strategy.takes_hetero_builders and ZeroCopyDDPStrategy(cache_budget=0).takes_hetero_builders
    dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[2, 2], batch_size=4, num_threads=1)
    strategy._preflight(SimpleNamespace(strategy=strategy, callbacks=[]), dm)  # no error

    class OneTableConsumer:  # a host-memory consumer that does not say it takes typed builders
        def attach_host_memory(self, trainer, datamodule) -> None:
            raise AssertionError("not reached")

    trainer = SimpleNamespace(strategy=strategy, callbacks=[OneTableConsumer()])
    with pytest.raises(RecipeError) as refused:  # what the launcher asks before it starts a rank
        strategy._preflight(trainer, dm)
    message = str(refused.value)
    assert "\n" not in message and "OneTableConsumer" in message and "remove it from trainer.callbacks" in message
    strategy._preflight(trainer, None)  # no DataModule: nothing to check


@pytest.mark.slow
@pytest.mark.parametrize("ranking", ["degree", "presample"])
def test_two_ranks_decide_one_cache_over_typed_rows_and_train(tmp_path: Path, ranking: str) -> None:
    before = shm_names()
    reports = rank_reports(_run(tmp_path, "fit", devices=2, strategy="zerocopy_ddp", cache_budget="4KiB",
                            cache_ranking=ranking), 2)  # fmt: skip
    caches = [r["cache"] for r in reports]
    assert caches[0] == caches[1]  # the same plans on both ranks (CPU ranks: decided, nothing placed)
    assert set(caches[0]["rows"]) == {"paper", "institution"}  # the script's featured types
    assert 0 < sum(caches[0]["rows"].values()) and caches[0]["bytes_per_gpu"] <= 4096
    shares = [[s for _, _, _, seeds in r["batches"] for s in seeds] for r in reports]
    assert len(shares[0]) == len(shares[1]) > 0 and not set(shares[0]) & set(shares[1])
    assert not {n for n in shm_names() - before if n.startswith(f"lzc-{reports[0]['pid']}-")}


# ---- two GPUs (NCCL, GPU sampler, zero-copy gather through the typed cache; every batch checked) ---------------------


@pytest.mark.two_gpus
@pytest.mark.parametrize("pipeline", [False, True], ids=["in_process", "worker"])
def test_a_clique_on_two_gpus_shards_every_type_reads_the_peer_and_builds_the_uncached_cpu_batches(
    tmp_path: Path, pipeline: bool
) -> None:
    """``cache_policy: clique`` over typed rows on two GPUs: each rank fills its shard of every featured type on its
    own GPU, opens the peer's over CUDA IPC, and gathers hot rows from both shards and the rest from host memory;
    every training batch (built in the trainer or in a pipeline worker) is bitwise the batch an uncached CPU builder
    makes from the same plan item. A 48 KiB budget holds 1482 of 6000 papers and all 72 institutions over the two
    shards (degree ranking), so papers are read from both shards and from host memory."""
    before = shm_names()
    reports = rank_reports(_run(tmp_path, "fit", accelerator="gpu", devices=2, strategy="zerocopy_ddp", num_papers=6000,
                            cache_policy="clique", cache_budget="48KiB", pipeline=pipeline), 2)  # fmt: skip
    assert reports[0]["cache"] == reports[1]["cache"]  # one decision: the same plans on both ranks
    assert reports[0]["cache"]["rows"]["paper"] > 0 and reports[0]["cache"]["rows"]["institution"] > 0
    for rank, r in enumerate(reports):
        assert r["policy"] == "clique" and r["group"] == [0, 1] and r["shard_index"] == rank == r["device"]
        assert r["compared"] == len(r["batches"]) == r["steps_per_epoch"] > 0  # every batch matched the CPU one
        for node_type in ("paper", "institution"):
            assert r["shard_gpus"][node_type] == [0, 1], r["shard_gpus"]  # shard s lives on GPU s
            assert r["shard_local"][node_type] == [s == rank for s in range(2)]  # the other one is the peer's
        total = r["rows_total"]  # this rank's gathers (its worker's with a pipeline)
        assert total["local_rows"] > 0 and total["peer_rows"] > 0 and total["host_rows"] > 0, total
        if not pipeline:  # the trainer gathered: its per-type counters saw the peer's shard of papers
            paper = r["rows_per_type"]["paper"]
            assert paper["local"] > 0 and paper["peer"] > 0 and paper["host"] > 0, r["rows_per_type"]
    shares = [[s for _, _, _, seeds in r["batches"] for s in seeds] for r in reports]
    assert not set(shares[0]) & set(shares[1])
    pids = {str(r["pid"]) for r in reports}
    left = {n for n in shm_names() - before if any(n.startswith(f"lzc-{pid}-") for pid in pids) or n.startswith("cuda.shm.")}
    assert not left, left
