"""The heterogeneous sampling micro benchmark: per-hop figures that add up, and the sampler left as it was found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.parts import hetero_sampling
from lightning_zerocopy.sampling import hetero
from lightning_zerocopy.sampling.neighbor_sampler import CSCKernel


def test_ci_graph_on_the_cpu_gives_one_entry_per_hop(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    report = hetero_sampling.main(["--preset", "ci", "--placement", "cpu", "--batches", "2", "--warmup", "1",
                                   "--num-neighbors", "4,3", "--cache-dir", str(tmp_path / "cache"), "--out", str(out)])
    assert json.loads(out.read_text())["hops"] == report["hops"]
    assert [len(report["hops"]), report["graph"]["fanouts"]] == [2, [4, 3]]
    first, second = report["hops"]
    into_papers = sum(1 for name in hetero_sampling_edge_types(tmp_path) if name.endswith("__paper"))
    assert first["frontier"] == report["graph"]["batch_size"] * into_papers  # hop 0: the seeds, per edge type into them
    assert report["kernel_calls_per_batch"] == 2  # one fused call per hop (one fanout per hop)
    for hop in report["hops"]:
        assert 0 < hop["new_nodes"] <= hop["candidates"] and hop["kernel_calls"] == 1 and hop["dedup_calls"] == 1
        assert hop["kernel_ms"] > 0 and hop["dedup_ms"] > 0 and hop["sort_bound_ms"] > 0
        assert hop["hop_ms"] >= hop["draw_ms"] >= hop["kernel_ms"]  # the draw holds its kernel calls
    assert second["frontier"] > first["frontier"]  # hop 1 targets hop 0's new nodes (a growing neighborhood)
    assert report["plain_ms_median"] > 0


def hetero_sampling_edge_types(tmp_path: Path) -> list[str]:
    """The ci preset's edge types, as its dataset names them."""
    from benchmarks.end_to_end.hetero.__main__ import dataset_kwargs, parse_args
    from benchmarks.end_to_end.hetero.train import build_dataset

    graph = parse_args(["--preset", "ci", "--cache-dir", str(tmp_path / "cache")])
    return ["__".join(et) for et in build_dataset(dataset_kwargs(graph)).edge_types]


def test_instrumentation_is_undone_even_when_sampling_fails() -> None:
    originals = (hetero._draw_hop, CSCKernel._call, hetero.dedup_by_type)
    clock = hetero_sampling.SectionClock(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="boom"):
        with hetero_sampling.instrumented(clock):
            assert hetero.dedup_by_type is not originals[2] and hetero._draw_hop is not originals[0]
            raise RuntimeError("boom")
    assert (hetero._draw_hop, CSCKernel._call, hetero.dedup_by_type) == originals
