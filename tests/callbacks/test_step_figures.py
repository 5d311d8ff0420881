"""Telemetry sums: a run's figures are ratios of sums, and over DDP ranks the sums are added before dividing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_zerocopy.callbacks.step_figures import Ratio, StepSums, log_epoch_figures, reduce_over_ranks


def _step(stall_s: float, interval_s: float, edges: float = 1000.0, build_ms: float | None = None) -> dict[str, float]:
    step = {"stall_s": stall_s, "interval_s": interval_s, "wait_s": stall_s / 2, "edges": edges, "x_bytes": 4096.0}
    if build_ms is not None:
        step["build_ms"] = build_ms
    return step


def _sums(steps: list[dict[str, float]]) -> StepSums:
    sums = StepSums()
    for step in steps:
        sums.add(step)
    return sums


class _TwoRanks:
    """A strategy whose ``reduce(sum)`` adds the other rank's tensor, as an all-reduce over two ranks would."""

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other

    def reduce(self, tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        assert reduce_op == "sum"
        return tensor + self.other


def _pairs(figures: dict[str, Ratio]) -> torch.Tensor:
    return torch.tensor([(r.numerator, r.denominator or 0.0) for r in figures.values()], dtype=torch.float64)


def test_figures_of_a_run_are_ratios_of_its_sums() -> None:
    steps = [_step(0.001, 0.010, build_ms=2.0), _step(0.009, 0.030, build_ms=4.0), _step(0.0, 0.020, edges=-1.0)]
    figures = {k: r.value for k, r in _sums(steps).figures().items()}
    assert figures["data/stall_frac"] == pytest.approx(0.010 / 0.060)  # not the mean of 0.1, 0.3 and 0
    assert figures["data/stall_ms"] == pytest.approx(10.0 / 3)
    assert figures["data/step_ms"] == pytest.approx(20.0)
    assert figures["data/seps"] == pytest.approx(2000 / 0.040)  # only the steps whose batch had edges
    assert figures["data/gather_GBps"] == pytest.approx(3 * 4096 / 0.060 / 1e9)
    assert figures["data/build_ms"] == pytest.approx(3.0)
    assert StepSums().figures() == {}


def test_over_ranks_the_sums_are_added_before_dividing() -> None:
    rank0 = [_step(0.001, 0.010), _step(0.001, 0.010)]
    rank1 = [_step(0.020, 0.040)]
    mine, theirs = _sums(rank0).figures(), _sums(rank1).figures()
    module = SimpleNamespace(device=torch.device("cpu"))
    reduced = reduce_over_ranks(SimpleNamespace(strategy=_TwoRanks(_pairs(theirs))), module, mine)
    together = {k: r.value for k, r in _sums(rank0 + rank1).figures().items()}
    assert reduced == pytest.approx(together)
    assert reduced["data/stall_frac"] == pytest.approx(0.022 / 0.060)
    assert reduced["data/stall_frac"] != pytest.approx((mine["data/stall_frac"].value + theirs["data/stall_frac"].value) / 2)


def test_totals_are_summed_and_rates_recomputed_from_the_sums() -> None:
    mine = {"cache/hit_rate": Ratio(90, 100), "cache/host_rows": Ratio(10)}
    theirs = {"cache/hit_rate": Ratio(10, 100), "cache/host_rows": Ratio(90)}
    logged: dict[str, tuple[torch.Tensor, dict]] = {}
    module = SimpleNamespace(device=torch.device("cpu"), log=lambda name, value, **kw: logged.update({name: (value, kw)}))
    out = log_epoch_figures(SimpleNamespace(strategy=_TwoRanks(_pairs(theirs))), module, mine, suffix="_epoch")
    assert out == {"cache/hit_rate": pytest.approx(0.5), "cache/host_rows": 100.0}
    value, kwargs = logged["cache/hit_rate_epoch"]
    assert value.dtype == torch.float64 and float(value) == pytest.approx(0.5)
    # already the job's figure on every rank: Lightning's sync over ranks must leave it as it is
    assert kwargs == {"on_step": False, "on_epoch": True, "sync_dist": True, "reduce_fx": "max"}


def test_without_a_distributed_strategy_the_figures_are_this_ranks() -> None:
    figures = {"cache/hit_rate": Ratio(3, 4)}
    assert reduce_over_ranks(SimpleNamespace(), SimpleNamespace(device=None), figures) == {"cache/hit_rate": 0.75}


def _rank_main(rank: int, store: str, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        # rank 1 sampled some batches on the GPU, rank 0 none: only rank 1 has the figure
        figures = {"data/stall_frac": Ratio(1.0 + rank, 10.0)}
        if rank == 1:
            figures["data/share_gpu"] = Ratio(3.0, 4.0)
        trainer = SimpleNamespace(strategy=SimpleNamespace(reduce=lambda t, reduce_op: (dist.all_reduce(t), t)[1]))
        reduced = reduce_over_ranks(trainer, SimpleNamespace(device=torch.device("cpu")), figures)
        with open(f"{out}{rank}.json", "w") as f:
            json.dump(reduced, f)
    finally:
        dist.destroy_process_group()


def test_a_figure_only_some_ranks_have_is_reduced_by_all(tmp_path) -> None:
    """Every rank must take part in the same collectives: the names are agreed first (a rank without the figure
    adds nothing to it), so a rank-specific figure neither hangs nor misaligns the others."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(str(tmp_path / "store"), str(tmp_path / "rank")), nprocs=2, join=True)
    reduced = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reduced[0] == reduced[1] == {"data/share_gpu": pytest.approx(0.75), "data/stall_frac": pytest.approx(0.15)}
