"""The scaling benchmark (``benchmarks/scaling/``) end to end in its CPU plumbing mode: one Lightning fit per
configuration in a fresh process, the Strategy's cache decision and the JSON it writes (figures not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _run_scaling(tmp_path: Path, *flags: str) -> dict:
    """``benchmarks/scaling/`` in its CPU mode on a 5000-node graph with ``flags``; its JSON report."""
    out = tmp_path / "scaling.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling", "--device", "cpu", "--policies", "auto", "--num-nodes", "5000",
         "--limit-batches", "2", "--batch-size", "128", "--presample-batches", "4",
         "--cache-dir", str(tmp_path / "cache"), "--out", str(out), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_cpu_plumbing_run_writes_every_configuration(tmp_path: Path) -> None:
    report = _run_scaling(tmp_path, "--gpus", "1", "--budgets", "0,0.3", "--epochs", "2")
    assert report["config"]["device"] == "cpu" and "topo_m" in report["topology"]
    runs = {r["budget_fraction"]: r for r in report["runs"]}
    assert set(runs) == {0.0, 0.3}
    for r in runs.values():
        assert r["returncode"] == 0 and "error" not in r, r
        assert r["epoch_s"] > 0 and r["steps_per_epoch"] == 2
    assert runs[0.0]["chosen_policy"] is None  # no budget, no cache
    cached = runs[0.3]
    assert cached["chosen_policy"] == "replicate" and "one GPU" in cached["note"]
    assert cached["cached_rows"] == int(0.3 * 5000) and 0 < cached["expected_hit_rate"] <= 1


def test_two_cpu_ranks_report_one_shared_host_copy(tmp_path: Path) -> None:
    """Each rank's PSS of the host copy is measured; two ranks on one machine add up to about one copy while each
    maps all of it (RSS) — the issue's 'one host copy per machine', as the GPU runs will report it."""
    runs = {r["gpus"]: r for r in _run_scaling(tmp_path, "--gpus", "1,2", "--budgets", "0.3", "--epochs", "1")["runs"]}
    assert set(runs) == {1, 2}
    for r in runs.values():
        assert "error" not in r, r
        assert r["host_data_GB"] > 0 and 0.5 < r["host_pss_over_data"] < 1.25, r
    # scaling is throughput: every rank trains --limit-batches batches of its own seeds per epoch
    for gpus, r in runs.items():
        assert r["seeds_per_s"] == pytest.approx(gpus * 128 * 2 / r["epoch_s"]) and r["pipeline"] == "off"
    assert runs[2]["speedup_vs_1gpu"] == pytest.approx(runs[2]["seeds_per_s"] / runs[1]["seeds_per_s"])
    assert all(r["step_sigterm_broadcast"] is False for r in runs.values())  # skipped, as the command skips it
    pair = runs[2]["per_rank"]
    assert len(pair) == 2 and all(p["host_pss_bytes"] < 0.75 * p["host_rss_bytes"] for p in pair), pair


def test_hetero_mode_on_two_cpu_ranks_scales_the_typed_cache_runs_within_their_budget(tmp_path: Path) -> None:
    """``--graph hetero`` on the hetero benchmark's ``ci`` preset: the graph is prepared once, 1 and 2 gloo ranks
    train ``ZeroCopyHeteroDataModule`` under the Strategy's cache over typed rows, and the scaling figure is the
    homogeneous one (seeds/s over the 1-GPU run's). ``--run-budget-s`` cuts the measured epoch to the same step on
    both ranks (were they to differ, one rank would wait in an all-reduce and the run would time out). PyG's row
    fails alone with the reason where neither pyg-lib nor torch-sparse imports, and the sweep goes on."""
    report = _run_scaling(tmp_path, "--graph", "hetero", "--preset", "ci", "--gpus", "1,2", "--policies", "replicate",
                          "--budgets", "0.3", "--epochs", "2", "--warmup-batches", "3", "--limit-batches", "40",
                          "--run-budget-s", "0.001", "--pyg-gpus", "1", "--pyg-workers", "0", "--timeout", "300",
                          "--batch-size", "32")  # fmt: skip
    assert report["graph"] == "hetero" and report["config"]["preset"] == "ci"
    graph = report["hetero_graph"]
    assert graph["num_nodes"]["paper"] == 3000 and set(graph["num_nodes"]) == {"paper", "author", "institution",
                                                                               "field_of_study"}  # fmt: skip
    ours = {r["gpus"]: r for r in report["runs"] if r["loader"] == "ours"}
    assert set(ours) == {1, 2}
    for gpus, r in ours.items():
        assert "error" not in r, r
        assert r["batch_size"] == 32  # --batch-size over the preset's 64 (28 batches a rank on 2 ranks)
        assert r["steps_per_epoch"] == r["measured_steps"] == 10  # the cap's floor: the budget holds almost no step
        assert r["seeds_per_s"] == pytest.approx(gpus * 32 * r["rank_steps_per_s"])
        assert r["chosen_policy"] == "replicate" and 0 < r["cached_rows"]["paper"] < 0.3 * 3000  # lookup charged
        assert [set(t) for t in r["cache_per_type"]] == [{"paper"}] * gpus  # CPU ranks place nothing: no counts
    assert ours[2]["speedup_vs_1gpu"] == pytest.approx(ours[2]["seeds_per_s"] / ours[1]["seeds_per_s"])
    assert 0.5 < ours[2]["host_pss_over_data"] < 1.25  # one host copy of every type's CSC and table for both ranks
    pyg = next(r for r in report["runs"] if r["loader"] == "pyg")
    if "error" in pyg:  # this machine has neither backend; the GPU box carries torch-sparse (--pyg-site)
        assert "pyg-lib or torch-sparse" in pyg["error"], pyg["error"][-2000:]
    else:
        assert pyg["seeds_per_s"] > 0 and pyg["batch_size"] == 32
        assert pyg["step_sigterm_broadcast"] is True  # PyG under Lightning's DDP, as its users run it


def test_hetero_mode_defaults_to_the_mag_preset_and_its_batch_size() -> None:
    from benchmarks.scaling.__main__ import parse_args
    from benchmarks.scaling.hetero import hetero_args

    args = parse_args(["--graph", "hetero"])
    assert args.preset == "mag" and args.batch_size is None
    mag = hetero_args(args)
    assert mag.papers == 736_389 and mag.batch_size == 1024 and mag.fanouts == [10, 10]
    assert hetero_args(parse_args(["--graph", "hetero", "--preset", "ci"])).papers == 3000
    with pytest.raises(SystemExit):
        parse_args(["--preset", "mag"])  # a preset names a heterogeneous graph


def test_throughput_counts_the_steps_of_every_measured_epoch() -> None:
    """Epochs cut by the run budget have fewer steps than the warm-up: seeds/s counts the steps each epoch ran."""
    from benchmarks.scaling.__main__ import _throughput

    rank0 = {"epoch_s": [9.0, 2.0, 1.0], "epoch_steps": [30, 20, 10], "batch_size": 64, "steps_per_epoch": 10}
    figures = _throughput(rank0, gpus=2)
    assert figures["rank_steps_per_s"] == pytest.approx(10.0) and figures["measured_steps"] == 30
    assert figures["seeds_per_s"] == pytest.approx(2 * 64 * 10.0) and figures["epoch_s"] == pytest.approx(1.5)


def test_pyg_rank_shares_are_disjoint_and_cover_the_seeds() -> None:
    import torch

    from benchmarks.scaling.pyg_ddp import rank_share

    seeds = torch.arange(100, 201)
    shares = [rank_share(seeds, 3, r, 2) for r in range(2)]
    assert abs(shares[0].numel() - shares[1].numel()) <= 1
    assert sorted(torch.cat(shares).tolist()) == seeds.tolist()
    assert torch.equal(shares[0], rank_share(seeds, 3, 0, 2)) and not torch.equal(shares[0], rank_share(seeds, 4, 0, 2))
