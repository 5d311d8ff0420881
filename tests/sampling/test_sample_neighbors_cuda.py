"""The CUDA sampler (``zerocopy::sample_neighbors`` with CUDA seeds) on GPU-resident and UVA topology.

The GPU kernel draws from the same counter-based streams with the same algorithms as the CPU kernel, so its
output is checked to be bitwise the CPU op's output; on top of that it must pass, on its own output, the CPU
sampler's reference/invariant checks, its chi-square uniformity tests, determinism and bad-input tests
(helpers imported from ``test_sample_neighbors.py``).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from helpers import exclusive_host_copy, load_test_module, opcheck

from lightning_zerocopy import ops

pytestmark = pytest.mark.cuda

cpu_tests = load_test_module(__file__, "test_sample_neighbors")

PLACEMENTS = ["gpu", "uva", "uva-indices"]


class Placed:
    """indptr/indices placed for the CUDA kernel: both on the GPU (``gpu``), both in registered host memory
    (``uva``), or indptr on the GPU and indices in host memory (``uva-indices``)."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, placement: str) -> None:
        from lightning_zerocopy.graph import register_host_tensor

        self.registrations = []

        def host(t: torch.Tensor) -> torch.Tensor:
            if not t.is_contiguous() or t.numel() == 0:
                return t  # the op's contiguity/shape checks must fire before any pointer is used
            t = exclusive_host_copy(t)
            self.registrations.append(register_host_tensor(t))
            return t

        def gpu(t: torch.Tensor) -> torch.Tensor:
            if t.is_contiguous() or t.dim() != 1:
                return t.cuda()
            strided = torch.empty(2 * t.numel(), dtype=t.dtype, device="cuda")[::2]  # keep it non-contiguous
            return strided.copy_(t)

        if placement == "gpu":
            self.indptr, self.indices = gpu(indptr), gpu(indices)
        elif placement == "uva":
            self.indptr, self.indices = host(indptr), host(indices)
        elif placement == "uva-indices":
            self.indptr, self.indices = gpu(indptr), host(indices)
        else:
            raise ValueError(placement)

    def close(self) -> None:
        for r in self.registrations:
            r.close()

    def __enter__(self) -> "Placed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sample_cuda(placed: Placed, seeds: torch.Tensor, fanouts, replace: bool, seed: int) -> ops.SampledSubgraph:
    out = ops.sample_neighbors(placed.indptr, placed.indices, seeds.cuda(), fanouts, replace, seed)
    for name in ("n_id", "row", "col", "edge_pos"):
        t = getattr(out, name)
        assert t.is_cuda and t.dtype == torch.int64, name
    for name in ("num_sampled_nodes", "num_sampled_edges"):
        t = getattr(out, name)
        assert t.device.type == "cpu" and t.dtype == torch.int64, name
    return ops.SampledSubgraph(*(t.cpu() for t in out))


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[3, 2], [5, -1, 2], [1, 1, 1, 1], [90], [-1, -1, -1], [15, 10, 5]])
def test_matches_reference_invariants_and_cpu_bitwise(placement, index_dtype, replace, fanouts) -> None:
    gen = torch.Generator().manual_seed(2)
    graph = cpu_tests.random_graph(1000, 12000, gen, index_dtype)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 50, gen)
    with Placed(graph.indptr, graph.indices, placement) as placed:
        out = sample_cuda(placed, seeds, fanouts, replace, 11)
    # The CPU sampler's own checks: right pick counts, distinct picks without replacement, valid positions,
    # relabeling in first-appearance order (against the pure-Python reference), edges of the graph.
    cpu_tests.check_picks(graph, out, fanouts, replace)
    assert torch.equal(out.n_id[: seeds.numel()], seeds)
    assert out.n_id.unique().numel() == out.n_id.numel()
    assert out.num_sampled_nodes.sum() == out.n_id.numel()
    assert out.num_sampled_edges.sum() == out.row.numel() == out.col.numel() == out.edge_pos.numel()
    assert out.row.numel() > 0
    # Same streams, same algorithms: bitwise the CPU op's sample.
    cpu_tests.assert_same(out, ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, 11))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_full_neighborhoods_match_reference_exactly(placement) -> None:
    gen = torch.Generator().manual_seed(1)
    graph = cpu_tests.random_graph(400, 1600, gen, torch.int32)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 13, gen)
    with Placed(graph.indptr, graph.indices, placement) as placed:
        out = sample_cuda(placed, seeds, [-1, -1, -1], False, 7)
    reference = cpu_tests.reference_sample(graph.indptr, graph.indices, seeds, 3, cpu_tests.all_neighbors)
    cpu_tests.assert_same(out, reference)


@pytest.mark.parametrize("placement", ["gpu", "uva"])
def test_large_sample_is_deterministic_and_equals_cpu(placement) -> None:
    gen = torch.Generator().manual_seed(4)
    graph = cpu_tests.random_graph(20000, 200000, gen, torch.int32)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 1500, gen)
    with Placed(graph.indptr, graph.indices, placement) as placed:
        first = sample_cuda(placed, seeds, [15, 10, 5], False, 123)
        for _ in range(3):
            cpu_tests.assert_same(sample_cuda(placed, seeds, [15, 10, 5], False, 123), first)
        other = sample_cuda(placed, seeds, [15, 10, 5], False, 124)
    assert bool((first.num_sampled_nodes[:-1] > 1000).all())
    assert not torch.equal(other.edge_pos[: other.num_sampled_edges[0]], first.edge_pos[: first.num_sampled_edges[0]])
    cpu_tests.assert_same(first, ops.sample_neighbors(graph.indptr, graph.indices, seeds, [15, 10, 5], False, 123))


@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize(
    ("degree", "fanout", "replace"),
    [(20, 5, False), (150, 100, False), (1000, 100, False), (7, 3, True), (30, 29, False)],
    ids=["floyd", "fisher-yates", "floyd-large", "replacement", "nearly-all"],
)
def test_picks_are_uniform_over_positions(placement, degree: int, fanout: int, replace: bool) -> None:
    gen = torch.Generator().manual_seed(6)
    num_targets = max(4000, 400 * degree // fanout)
    graph = cpu_tests.regular_graph(num_targets, degree, gen)
    seeds = torch.arange(num_targets)
    counts = [0] * degree
    with Placed(graph.indptr, graph.indices, placement) as placed:
        for batch_seed in range(3):
            out = sample_cuda(placed, seeds, [fanout], replace, batch_seed)
            assert out.edge_pos.numel() == num_targets * fanout
            counts = [a + b for a, b in zip(counts, cpu_tests.slot_counts(graph, out, degree))]
            if batch_seed == 0:
                cpu_tests.assert_same(out, ops.sample_neighbors(graph.indptr, graph.indices, seeds, [fanout], replace, 0))
    assert cpu_tests.chi2_uniform_pvalue(counts) > 1e-4, counts


@pytest.mark.parametrize("replace", [False, True])
def test_bounded_fanouts_beyond_the_lean_budget_equal_cpu(replace: bool) -> None:
    """Bounded fanouts normally take the lean path (one read-back per batch); when the padded pick slots of the
    hops pass its budget (2**24: here 20000 * 50 + min(20000 * 50, 400000) * 50 = 2.1e7) the per-hop path runs.
    Both paths give the CPU sample, with and without replacement (many picks per target, which need the pick
    policy's scratch, are covered by the uniformity tests above)."""
    gen = torch.Generator().manual_seed(12)
    graph = cpu_tests.random_graph(400000, 4000000, gen, torch.int32)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 20000, gen)
    with Placed(graph.indptr, graph.indices, "gpu") as placed:
        for fanouts in ([50, 50, 2], [3, 2, 2]):  # beyond the lean budget; within it
            out = sample_cuda(placed, seeds, fanouts, replace, 31)
            cpu_tests.assert_same(out, ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, 31))


@pytest.mark.parametrize("replace", [False, True])
def test_lean_switch_off_takes_the_per_hop_path_with_the_same_sample(replace: bool) -> None:
    """``ops.set_lean_sampler(False)`` (what benchmarks/parts/lean_sampler.py compares) sends bounded batches down the
    per-hop path; both give the CPU sample, and the switch returns its previous setting."""
    gen = torch.Generator().manual_seed(13)
    graph = cpu_tests.random_graph(50000, 500000, gen, torch.int64)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 1024, gen)
    want = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [15, 10, 5], replace, 7)
    with Placed(graph.indptr, graph.indices, "gpu") as placed:
        assert ops.set_lean_sampler(False) is True
        try:
            per_hop = sample_cuda(placed, seeds, [15, 10, 5], replace, 7)
        finally:
            assert ops.set_lean_sampler(True) is False
        lean = sample_cuda(placed, seeds, [15, 10, 5], replace, 7)
    cpu_tests.assert_same(per_hop, want)
    cpu_tests.assert_same(lean, want)


@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize(("degree", "fanout"), cpu_tests.ORDER_CASES, ids=cpu_tests.ORDER_IDS)
def test_pick_order_is_uniform_and_equals_cpu(placement, degree: int, fanout: int) -> None:
    num_targets = max(3000, 60 * degree)
    graph = cpu_tests.regular_graph(num_targets, degree, torch.Generator().manual_seed(8))
    seeds = torch.arange(num_targets)
    with Placed(graph.indptr, graph.indices, placement) as placed:
        out = sample_cuda(placed, seeds, [fanout], False, 5)
    cpu_tests.assert_same(out, ops.sample_neighbors(graph.indptr, graph.indices, seeds, [fanout], False, 5))
    counts = cpu_tests.position_counts(graph, out, degree, fanout)
    for j in sorted({0, 1, fanout // 2, fanout - 1}):
        assert cpu_tests.chi2_uniform_pvalue(counts[j]) > 1e-4, (j, counts[j])


@pytest.mark.parametrize("placement", ["gpu", "uva"])
def test_subsets_without_replacement_are_uniform(placement) -> None:
    degree, fanout, num_targets = 6, 2, 15000
    graph = cpu_tests.regular_graph(num_targets, degree, torch.Generator().manual_seed(7))
    with Placed(graph.indptr, graph.indices, placement) as placed:
        out = sample_cuda(placed, torch.arange(num_targets), [fanout], False, 99)
    slots = (out.edge_pos - graph.indptr[out.n_id[out.col]]).view(num_targets, fanout)
    subsets = Counter(tuple(sorted(pair)) for pair in slots.tolist())
    assert len(subsets) == math.comb(degree, fanout)
    assert cpu_tests.chi2_uniform_pvalue(list(subsets.values())) > 1e-4, subsets


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize("case", cpu_tests.BAD_INPUTS.keys())
def test_bad_input_raises_naming_the_argument(placement: str, case: str) -> None:
    change, error, name = cpu_tests.BAD_INPUTS[case]
    args = cpu_tests._valid_args()
    bad = change(args)

    def run(a: dict) -> ops.SampledSubgraph:
        with Placed(a["indptr"], a["indices"], placement) as placed:
            seeds = a["seeds"]
            seeds = seeds.cuda() if seeds.is_contiguous() else torch.arange(20, device="cuda")[::2]  # strided view
            out = ops.sample_neighbors(placed.indptr, placed.indices, seeds, a["fanouts"], a["replace"], a["seed"])
            return ops.SampledSubgraph(*(t.cpu() for t in out))

    good = run(args)
    with pytest.raises(error, match=f"`{name}"):
        run(bad)
    cpu_tests.assert_same(run(args), good)  # no state survives a failed call


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_bad_neighbor_deep_in_the_sample_raises(placement) -> None:
    indptr = torch.tensor([0, 1, 2, 3], dtype=torch.int64)
    indices = torch.tensor([1, 2, 7], dtype=torch.int64)
    with Placed(indptr, indices, placement) as placed:
        with pytest.raises(IndexError, match="`indices\\[2\\]` = 7"):
            ops.sample_neighbors(placed.indptr, placed.indices, torch.tensor([0], device="cuda"), [-1, -1, -1], False, 0)
        out = ops.sample_neighbors(placed.indptr, placed.indices, torch.tensor([1, 0], device="cuda"), [-1], False, 0)
        assert out.n_id.tolist() == [1, 0, 2]


def test_unregistered_host_topology_raises() -> None:
    graph = cpu_tests.random_graph(50, 300, torch.Generator().manual_seed(8), torch.int32)
    seeds = torch.tensor([1, 2], device="cuda")
    with pytest.raises(ValueError, match="`indices`.*not pinned and mapped"):
        ops.sample_neighbors(graph.indptr.cuda(), graph.indices, seeds, [2], False, 0)
    with pytest.raises(ValueError, match="`indptr`.*not pinned and mapped"):
        ops.sample_neighbors(graph.indptr, graph.indices.cuda(), seeds, [2], False, 0)


def test_runs_on_the_current_stream() -> None:
    gen = torch.Generator().manual_seed(10)
    graph = cpu_tests.random_graph(3000, 30000, gen)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 200, gen)
    with Placed(graph.indptr, graph.indices, "gpu") as placed:
        side = torch.cuda.Stream()
        real = seeds.cuda()
        buffer = torch.zeros_like(real)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)
            buffer.copy_(real)  # the seeds exist only after the sleep, on this stream
            out = ops.sample_neighbors(placed.indptr, placed.indices, buffer, [5, 3], False, 3)
            n_id = out.n_id.cpu()
    expected = ops.sample_neighbors(graph.indptr, graph.indices, seeds, [5, 3], False, 3)
    assert torch.equal(n_id, expected.n_id)


def test_opcheck_cuda() -> None:
    gen = torch.Generator().manual_seed(9)
    graph = cpu_tests.random_graph(300, 2000, gen, torch.int32)
    args = (graph.indptr.cuda(), graph.indices.cuda(), cpu_tests.random_seeds(300, 20, gen).cuda(), [4, -1, 2], False, 31)
    opcheck(torch.ops.zerocopy.sample_neighbors.default, args)


@pytest.mark.parametrize("placement,uva_indptr", [("gpu", "gpu"), ("uva", "gpu"), ("uva", "host")])
def test_neighbor_sampler_placements_give_the_cpu_batch(placement: str, uva_indptr: str) -> None:
    from lightning_zerocopy.sampling import NeighborSampler

    gen = torch.Generator().manual_seed(12)
    graph = cpu_tests.random_graph(5000, 60000, gen, torch.int32)
    host = cpu_tests.Graph(*(exclusive_host_copy(t) for t in graph))  # own pages: registration is per page
    seeds = cpu_tests.random_seeds(graph.num_nodes, 300, gen)
    cpu = NeighborSampler(graph.indptr, graph.indices, graph.edge_perm, fanouts=[10, 5])
    gpu = NeighborSampler(host.indptr, host.indices, host.edge_perm, fanouts=[10, 5], placement=placement,
                          uva_indptr=uva_indptr)  # fmt: skip
    try:
        for batch_seed in (0, 1):
            a, b = cpu.sample(seeds, batch_seed), gpu.sample(seeds, batch_seed)
            assert b.n_id.is_cuda and b.edge_index.is_cuda and b.e_id.is_cuda
            assert torch.equal(a.n_id, b.n_id.cpu()) and torch.equal(a.edge_index, b.edge_index.cpu())
            assert torch.equal(a.e_id, b.e_id.cpu())
            assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
            assert a.batch_size == b.batch_size == 300
    finally:
        gpu.close()
    with pytest.raises(ValueError, match="placement"):
        NeighborSampler(graph.indptr, graph.indices, fanouts=[2], placement="tpu")
