"""Tests of the compiled op ``zerocopy::sample_neighbors`` (CPU kernel) against a pure-Python reference."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Callable, NamedTuple

import pytest
import torch
from helpers import opcheck

from lightning_zerocopy import ops

PickFn = Callable[[int, int, int, int], list[int]]  # (hop, target global id, begin, end) -> edge positions


class Graph(NamedTuple):
    indptr: torch.Tensor
    indices: torch.Tensor
    edge_perm: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1


def csc_from_coo(src: torch.Tensor, dst: torch.Tensor, num_nodes: int, index_dtype=torch.int64) -> Graph:
    """Pure-torch CSC over ``dst`` (incoming edges), sources sorted within each target."""
    order = torch.argsort(dst * num_nodes + src, stable=True)
    counts = torch.bincount(dst, minlength=num_nodes)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    return Graph(indptr, src[order].to(index_dtype).contiguous(), order, src, dst)


def random_graph(num_nodes: int, num_edges: int, generator: torch.Generator, index_dtype=torch.int64) -> Graph:
    """A directed random graph with skewed in-degrees (some hubs, some isolated nodes)."""
    weights = torch.rand(num_nodes, generator=generator) ** 4 + 1e-3
    weights[torch.randperm(num_nodes, generator=generator)[: num_nodes // 10]] = 0  # no incoming edges
    dst = torch.multinomial(weights, num_edges, replacement=True, generator=generator)
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    return csc_from_coo(src, dst, num_nodes, index_dtype)


def random_seeds(num_nodes: int, count: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randperm(num_nodes, generator=generator)[:count]


def expected_picks(degree: int, fanout: int, replace: bool) -> int:
    if fanout < 0:
        return degree
    if replace:
        return fanout if degree > 0 else 0
    return min(degree, fanout)


def reference_sample(
    indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, num_hops: int, picks: PickFn
) -> ops.SampledSubgraph:
    """Slow reference: BFS by hop over frontiers, relabelling in edge order with a dict."""
    ptr, nbr = indptr.tolist(), indices.tolist()
    n_id = seeds.tolist()
    local = {node: i for i, node in enumerate(n_id)}
    row, col, pos = [], [], []
    num_nodes_per_hop, num_edges_per_hop = [len(n_id)], []
    begin = 0
    for hop in range(num_hops):
        end, added = len(n_id), 0
        for target in range(begin, end):
            v = n_id[target]
            for p in picks(hop, v, ptr[v], ptr[v + 1]):
                u = nbr[p]
                if u not in local:
                    local[u] = len(n_id)
                    n_id.append(u)
                row.append(local[u])
                col.append(target)
                pos.append(p)
                added += 1
        num_edges_per_hop.append(added)
        num_nodes_per_hop.append(len(n_id) - end)
        begin = end
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    return ops.SampledSubgraph(
        as_tensor(n_id), as_tensor(row), as_tensor(col), as_tensor(pos),
        as_tensor(num_nodes_per_hop), as_tensor(num_edges_per_hop),
    )  # fmt: skip


def all_neighbors(hop: int, node: int, begin: int, end: int) -> list[int]:
    return list(range(begin, end))


def kernel_picks(out: ops.SampledSubgraph) -> PickFn:
    """The kernel's own picks, keyed by (hop, target global id), in pick order."""
    by_target: dict[tuple[int, int], list[int]] = defaultdict(list)
    hop_of_edge = torch.repeat_interleave(torch.arange(out.num_sampled_edges.numel()), out.num_sampled_edges)
    for hop, target, p in zip(hop_of_edge.tolist(), out.n_id[out.col].tolist(), out.edge_pos.tolist()):
        by_target[(hop, target)].append(p)
    return lambda hop, node, begin, end: by_target.get((hop, node), [])


def assert_same(actual: ops.SampledSubgraph, expected: ops.SampledSubgraph) -> None:
    for name in ops.SampledSubgraph._fields:
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == torch.int64 and a.device.type == "cpu", name
        assert torch.equal(a, e), f"{name}: {a.tolist()[:20]} != {e.tolist()[:20]}"


def check_picks(graph: Graph, out: ops.SampledSubgraph, fanouts: list[int], replace: bool) -> None:
    """Every reference frontier target got the right number of valid picks (distinct without replacement)."""
    picks = kernel_picks(out)

    def checked(hop: int, node: int, begin: int, end: int) -> list[int]:
        chosen = picks(hop, node, begin, end)
        assert len(chosen) == expected_picks(end - begin, fanouts[hop], replace), (hop, node)
        assert all(begin <= p < end for p in chosen), (hop, node, chosen)
        if not replace:
            assert len(set(chosen)) == len(chosen), (hop, node, chosen)
        return chosen

    reference = reference_sample(graph.indptr, graph.indices, out.n_id[: out.num_sampled_nodes[0]], len(fanouts),
                                 checked)  # fmt: skip
    assert_same(out, reference)
    # Each sampled edge is an edge of the graph, walked against its direction (neighbor -> target).
    src, dst = out.n_id[out.row], out.n_id[out.col]
    assert torch.equal(graph.indices[out.edge_pos].long(), src)
    assert torch.equal(graph.dst[graph.edge_perm[out.edge_pos]], dst)
    assert torch.equal(graph.src[graph.edge_perm[out.edge_pos]], src)


# --------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("fanouts", [[-1], [-1, -1], [-1, -1, -1]])
def test_full_neighborhoods_match_reference_exactly(index_dtype: torch.dtype, fanouts: list[int]) -> None:
    gen = torch.Generator().manual_seed(1)
    graph = random_graph(400, 1600, gen, index_dtype)
    seeds = random_seeds(graph.num_nodes, 13, gen)
    out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, False, 7)
    assert_same(out, reference_sample(graph.indptr, graph.indices, seeds, len(fanouts), all_neighbors))
    assert out.num_sampled_edges.sum() > 0 and out.num_sampled_nodes[-1] > 0  # a non-trivial sample


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[3, 2], [5, -1, 2], [1, 1, 1, 1], [90]])
def test_sampled_structure_matches_reference(index_dtype: torch.dtype, replace: bool, fanouts: list[int]) -> None:
    gen = torch.Generator().manual_seed(2)
    graph = random_graph(1000, 12000, gen, index_dtype)
    seeds = random_seeds(graph.num_nodes, 50, gen)
    out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, 11)
    check_picks(graph, out, fanouts, replace)
    assert torch.equal(out.n_id[: seeds.numel()], seeds)
    assert out.n_id.unique().numel() == out.n_id.numel()
    assert out.num_sampled_nodes.sum() == out.n_id.numel()
    assert out.num_sampled_edges.sum() == out.row.numel() == out.col.numel() == out.edge_pos.numel()
    assert bool((out.col[: out.num_sampled_edges[0]] < seeds.numel()).all())  # hop 1 targets are the seeds


def test_with_replacement_repeats_positions() -> None:
    gen = torch.Generator().manual_seed(3)
    graph = random_graph(300, 900, gen)
    seeds = random_seeds(graph.num_nodes, 200, gen)
    out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [10], True, 5)
    pairs = torch.stack([out.col, out.edge_pos]).t().tolist()
    assert len({tuple(p) for p in pairs}) < len(pairs)  # some target picked one position twice


def test_directed_graph_walks_incoming_edges_only() -> None:
    # 0 -> 1 -> 2 -> 3, and 4 -> 2: the in-neighbors of 2 are {1, 4}; 3 reaches nothing new.
    src, dst = torch.tensor([0, 1, 2, 4]), torch.tensor([1, 2, 3, 2])
    graph = csc_from_coo(src, dst, 5)
    out = ops.sample_neighbors(graph.indptr, graph.indices, torch.tensor([2]), [-1, -1, -1], False, 0)
    assert out.n_id.tolist() == [2, 1, 4, 0]
    assert out.row.tolist() == [1, 2, 3] and out.col.tolist() == [0, 0, 1]
    assert out.num_sampled_nodes.tolist() == [1, 2, 1, 0]
    assert out.num_sampled_edges.tolist() == [2, 1, 0]
    sink = ops.sample_neighbors(graph.indptr, graph.indices, torch.tensor([0]), [-1], False, 0)
    assert sink.n_id.tolist() == [0] and sink.row.numel() == 0  # node 0 has no incoming edges


def test_frontier_nodes_are_not_expanded_twice() -> None:
    # Triangle 0 <-> 1 <-> 2 <-> 0: seeds {0}; hop 1 adds 1, 2; hop 2 expands 1 and 2 only.
    src = torch.tensor([0, 1, 1, 2, 2, 0])
    dst = torch.tensor([1, 0, 2, 1, 0, 2])
    graph = csc_from_coo(src, dst, 3)
    out = ops.sample_neighbors(graph.indptr, graph.indices, torch.tensor([0]), [-1, -1, -1], False, 0)
    assert out.num_sampled_nodes.tolist() == [1, 2, 0, 0]
    assert out.num_sampled_edges.tolist() == [2, 4, 0]
    assert sorted(out.col[2:].tolist()) == [1, 1, 2, 2]


# ------------------------------------------------------------------------------------------- determinism


def test_bitwise_deterministic_across_thread_counts_and_calls() -> None:
    gen = torch.Generator().manual_seed(4)
    graph = random_graph(60000, 600000, gen, torch.int32)
    seeds = random_seeds(graph.num_nodes, 3000, gen)
    previous = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 4, 1, 4):
            torch.set_num_threads(threads)
            results.append(ops.sample_neighbors(graph.indptr, graph.indices, seeds, [15, 10, 5], False, 123))
    finally:
        torch.set_num_threads(previous)
    assert bool((results[0].num_sampled_nodes[:-1] > 1000).all())  # every hop's frontier spans many tasks
    # Hops of >= 2**15 edges at >= 4 threads take the kernel's parallel relabel; it must match the sequential one.
    assert int(results[0].num_sampled_edges.max()) >= 2**15
    for other in results[1:]:
        assert_same(other, results[0])


@pytest.mark.parametrize("replace", [False, True])
def test_different_seeds_give_different_samples(replace: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    graph = random_graph(2000, 30000, gen)
    seeds = random_seeds(graph.num_nodes, 100, gen)
    first = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [4, 3], replace, 1)
    second = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [4, 3], replace, 2)
    again = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [4, 3], replace, 1)
    assert_same(again, first)
    assert not torch.equal(first.edge_pos[: first.num_sampled_edges[0]], second.edge_pos[: second.num_sampled_edges[0]])


# -------------------------------------------------------------------------------------------- uniformity


def chi2_pvalue(statistic: float, dof: int) -> float:
    """Upper tail P(X >= statistic) of a chi-square law, Wilson-Hilferty normal approximation."""
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi2_uniform_pvalue(counts: list[int]) -> float:
    expected = sum(counts) / len(counts)
    return chi2_pvalue(sum((c - expected) ** 2 / expected for c in counts), len(counts) - 1)


def test_chi2_helper_rejects_bias() -> None:
    assert chi2_uniform_pvalue([1000] * 20) > 0.5
    assert chi2_uniform_pvalue([1200] + [1000] * 18 + [800]) < 1e-6
    assert abs(chi2_pvalue(30.14, 19) - 0.05) < 0.005  # tabulated 95% quantile of chi2(19)


def regular_graph(num_targets: int, degree: int, generator: torch.Generator) -> Graph:
    """Every target has exactly ``degree`` incoming edges from random sources."""
    dst = torch.arange(num_targets).repeat_interleave(degree)
    src = torch.randint(0, num_targets, (dst.numel(),), generator=generator)
    indptr = torch.arange(0, num_targets * degree + 1, degree, dtype=torch.int64)
    return Graph(indptr, src, torch.arange(dst.numel()), src, dst)


def slot_counts(graph: Graph, out: ops.SampledSubgraph, degree: int) -> list[int]:
    slots = out.edge_pos - graph.indptr[out.n_id[out.col]]
    return torch.bincount(slots, minlength=degree).tolist()


@pytest.mark.parametrize(
    ("degree", "fanout", "replace"),
    [(20, 5, False), (150, 100, False), (1000, 100, False), (7, 3, True), (30, 29, False)],
    ids=["floyd", "fisher-yates", "floyd-hashed", "replacement", "nearly-all"],
)
def test_picks_are_uniform_over_positions(degree: int, fanout: int, replace: bool) -> None:
    gen = torch.Generator().manual_seed(6)
    num_targets = max(4000, 400 * degree // fanout)
    graph = regular_graph(num_targets, degree, gen)
    seeds = torch.arange(num_targets)
    counts = [0] * degree
    for batch_seed in range(3):
        out = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [fanout], replace, batch_seed)
        assert out.edge_pos.numel() == num_targets * fanout
        counts = [a + b for a, b in zip(counts, slot_counts(graph, out, degree))]
    assert chi2_uniform_pvalue(counts) > 1e-4, counts


def position_counts(graph: Graph, out: ops.SampledSubgraph, degree: int, fanout: int) -> list[list[int]]:
    """counts[j][o]: how often the j-th pick of a target was its neighbor at offset o (every target has
    ``fanout`` picks, so the picks of one target are ``fanout`` consecutive edges)."""
    slots = (out.edge_pos - graph.indptr[out.n_id[out.col]]).view(-1, fanout)
    return [torch.bincount(slots[:, j], minlength=degree).tolist() for j in range(fanout)]


ORDER_CASES = [(50, 10), (40, 40 - 1), (150, 100), (1000, 100)]
ORDER_IDS = ["floyd", "floyd-nearly-all", "fisher-yates", "floyd-hashed"]


@pytest.mark.parametrize(("degree", "fanout"), ORDER_CASES, ids=ORDER_IDS)
def test_pick_order_is_uniform_at_every_position(degree: int, fanout: int) -> None:
    """Each position of a target's pick sequence is uniform over its neighbors (Floyd's algorithm alone never
    put offsets 41-49 first for degree 50, fanout 10: order-dependent aggregators saw a biased sequence)."""
    num_targets = max(3000, 60 * degree)
    graph = regular_graph(num_targets, degree, torch.Generator().manual_seed(8))
    out = ops.sample_neighbors(graph.indptr, graph.indices, torch.arange(num_targets), [fanout], False, 5)
    counts = position_counts(graph, out, degree, fanout)
    for j in sorted({0, 1, fanout // 2, fanout - 1}):
        assert chi2_uniform_pvalue(counts[j]) > 1e-4, (j, counts[j])
    # Every (position, offset) pair occurs: no offset is barred from any position.
    assert all(c > 0 for row in counts for c in row)


def test_subsets_without_replacement_are_uniform() -> None:
    degree, fanout, num_targets = 6, 2, 15000
    graph = regular_graph(num_targets, degree, torch.Generator().manual_seed(7))
    out = ops.sample_neighbors(graph.indptr, graph.indices, torch.arange(num_targets), [fanout], False, 99)
    slots = (out.edge_pos - graph.indptr[out.n_id[out.col]]).view(num_targets, fanout)
    subsets = Counter(tuple(sorted(pair)) for pair in slots.tolist())
    assert len(subsets) == math.comb(degree, fanout)
    assert chi2_uniform_pvalue(list(subsets.values())) > 1e-4, subsets


# --------------------------------------------------------------------------------------------- bad input


def _valid_args() -> dict:
    gen = torch.Generator().manual_seed(8)
    graph = random_graph(50, 300, gen, torch.int32)
    return dict(
        indptr=graph.indptr, indices=graph.indices, seeds=random_seeds(50, 5, gen),
        fanouts=[3, 2], replace=False, seed=0,
    )  # fmt: skip


def _with(**changes) -> Callable[[dict], dict]:
    def change(args: dict) -> dict:
        return {**args, **{k: v(args) if callable(v) else v for k, v in changes.items()}}

    return change


def _broken_indptr(args: dict) -> torch.Tensor:
    indptr = args["indptr"].clone()
    v = int(args["seeds"][0])
    indptr[v + 1] = indptr[v] - 1  # decreasing at a seed
    return indptr


def _bad_neighbor(value: int) -> Callable[[dict], torch.Tensor]:
    def make(args: dict) -> torch.Tensor:
        indices = args["indices"].clone()
        indices[:] = value
        return indices

    return make


BAD_INPUTS = {
    "seed out of range": (_with(seeds=lambda a: torch.tensor([0, 50])), IndexError, "seeds"),
    "negative seed": (_with(seeds=lambda a: torch.tensor([-1])), IndexError, "seeds"),
    "duplicate seeds": (_with(seeds=lambda a: torch.tensor([3, 4, 3])), ValueError, "seeds"),
    "empty seeds": (_with(seeds=lambda a: torch.empty(0, dtype=torch.int64)), ValueError, "seeds"),
    "int32 seeds": (_with(seeds=lambda a: a["seeds"].int()), TypeError, "seeds"),
    "2-D seeds": (_with(seeds=lambda a: a["seeds"].view(1, -1)), ValueError, "seeds"),
    "strided seeds": (_with(seeds=lambda a: torch.arange(10)[::2]), ValueError, "seeds"),
    "int32 indptr": (_with(indptr=lambda a: a["indptr"].int()), TypeError, "indptr"),
    "empty indptr": (_with(indptr=lambda a: torch.empty(0, dtype=torch.int64)), ValueError, "indptr"),
    "2-D indptr": (_with(indptr=lambda a: a["indptr"].view(1, -1)), ValueError, "indptr"),
    "decreasing indptr": (_with(indptr=_broken_indptr), ValueError, "indptr"),
    "indptr past indices": (_with(indices=lambda a: a["indices"][:10].clone()), ValueError, "indptr"),
    "float indices": (_with(indices=lambda a: a["indices"].float()), TypeError, "indices"),
    "strided indices": (_with(indices=lambda a: a["indices"].repeat(2)[::2]), ValueError, "indices"),
    "neighbor out of range": (_with(indices=_bad_neighbor(50)), IndexError, "indices"),
    "negative neighbor": (_with(indices=_bad_neighbor(-3)), IndexError, "indices"),
    "fanout 0": (_with(fanouts=[3, 0]), ValueError, "fanouts"),
    "fanout -2": (_with(fanouts=[-2]), ValueError, "fanouts"),
    "no fanouts": (_with(fanouts=[]), ValueError, "fanouts"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.keys())
def test_bad_input_raises_naming_the_argument(case: str) -> None:
    change, error, name = BAD_INPUTS[case]
    args = _valid_args()
    good = ops.sample_neighbors(**args)
    with pytest.raises(error, match=f"`{name}"):
        ops.sample_neighbors(**change(args))
    # A failed call leaves no trace in the thread's id map: the next call is unaffected.
    assert_same(ops.sample_neighbors(**args), good)


def test_bad_neighbor_deep_in_the_sample_raises() -> None:
    # A path 0 <- 1 <- 2 whose last hop reads a corrupt id: the error comes after nodes were relabelled.
    indptr = torch.tensor([0, 1, 2, 3], dtype=torch.int64)
    indices = torch.tensor([1, 2, 7], dtype=torch.int64)
    with pytest.raises(IndexError, match="`indices\\[2\\]` = 7"):
        ops.sample_neighbors(indptr, indices, torch.tensor([0]), [-1, -1, -1], False, 0)
    out = ops.sample_neighbors(indptr, indices, torch.tensor([1, 0]), [-1], False, 0)
    assert out.n_id.tolist() == [1, 0, 2]


# ------------------------------------------------------------------------------------------------ opcheck


@pytest.mark.parametrize("replace", [False, True])
def test_opcheck(replace: bool) -> None:
    gen = torch.Generator().manual_seed(9)
    graph = random_graph(300, 2000, gen, torch.int32)
    args = (graph.indptr, graph.indices, random_seeds(300, 20, gen), [4, -1, 2], replace, 31)
    opcheck(torch.ops.zerocopy.sample_neighbors.default, args)


def test_fake_output_shapes_and_devices() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        indptr = mode.from_tensor(torch.zeros(11, dtype=torch.int64))
        indices = mode.from_tensor(torch.zeros(30, dtype=torch.int32))
        seeds = mode.from_tensor(torch.arange(4))
        out = ops.sample_neighbors(indptr, indices, seeds, [3, 2, 1], False, 0)
    assert [t.dtype for t in out] == [torch.int64] * 6
    assert out.num_sampled_nodes.shape == (4,) and out.num_sampled_edges.shape == (3,)
    assert out.row.shape == out.col.shape == out.edge_pos.shape

