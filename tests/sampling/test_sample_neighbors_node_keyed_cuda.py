"""Node-keyed (evaluation) sampling on the CUDA sampler: every path -- per-hop, lean, lean replayed from a CUDA
graph -- on GPU-resident and UVA topology gives bitwise the CPU kernel's node-keyed sample."""

from __future__ import annotations


import pytest
import torch
from helpers import exclusive_host_copy, load_test_module, opcheck

from lightning_zerocopy import ops

pytestmark = pytest.mark.cuda


cpu_tests = load_test_module(__file__, "test_sample_neighbors")
cuda_tests = load_test_module(__file__, "test_sample_neighbors_cuda")


def _keyed_cuda(placed, seeds: torch.Tensor, fanouts, replace: bool, seed: int) -> ops.SampledSubgraph:
    out = ops.sample_neighbors(placed.indptr, placed.indices, seeds.cuda(), fanouts, replace, seed, node_keyed=True)
    assert out.n_id.is_cuda and out.row.is_cuda and out.num_sampled_nodes.device.type == "cpu"
    return ops.SampledSubgraph(*(t.cpu() for t in out))


def _keyed_cpu(graph, seeds: torch.Tensor, fanouts, replace: bool, seed: int) -> ops.SampledSubgraph:
    return ops.sample_neighbors(graph.indptr, graph.indices, seeds, fanouts, replace, seed, node_keyed=True)


class _Switches:
    """``ops.set_lean_sampler`` / ``ops.set_sampler_graphs`` set for a block, restored after."""

    def __init__(self, lean: bool, graphs: bool) -> None:
        self.lean, self.graphs = lean, graphs

    def __enter__(self) -> None:
        self.old = (ops.set_lean_sampler(self.lean), ops.set_sampler_graphs(self.graphs))

    def __exit__(self, *exc) -> None:
        ops.set_lean_sampler(self.old[0])
        ops.set_sampler_graphs(self.old[1])


PATHS = {"per_hop": (False, False), "lean": (True, False), "lean_graph": (True, True)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("placement", cuda_tests.PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[10, 5], [5, -1, 2], [70, 3], [15, 10, 5]])
def test_every_cuda_path_equals_the_cpu_sample(path: str, placement: str, replace: bool, fanouts) -> None:
    gen = torch.Generator().manual_seed(31)
    graph = cpu_tests.random_graph(3000, 60000, gen, torch.int32)  # dense: nodes recur across levels
    batches = [(cpu_tests.random_seeds(graph.num_nodes, 400, gen), 5) for _ in range(4)]  # one shape: replays
    with _Switches(*PATHS[path]), cuda_tests.Placed(graph.indptr, graph.indices, placement) as placed:
        for seeds, seed in batches:
            want = _keyed_cpu(graph, seeds, fanouts, replace, seed)
            cpu_tests.assert_same(_keyed_cuda(placed, seeds, fanouts, replace, seed), want)
            assert want.n_id.unique().numel() < want.n_id.numel()  # the layered structure is exercised


@pytest.mark.parametrize("path", list(PATHS))
def test_samples_larger_than_the_graph_fit(path: str) -> None:
    """Node-keyed samples repeat nodes across levels, so n_id can be longer than the graph: the CUDA node bound
    caps each level at num_nodes, not the whole sample."""
    gen = torch.Generator().manual_seed(32)
    graph = cpu_tests.random_graph(40, 1200, gen, torch.int64)
    seeds = torch.arange(40)
    with _Switches(*PATHS[path]), cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        for fanouts in ([8, 8, 8], [-1, 4, -1]):
            for _ in range(3):
                want = _keyed_cpu(graph, seeds, fanouts, False, 1)
                assert want.n_id.numel() > 2 * graph.num_nodes
                cpu_tests.assert_same(_keyed_cuda(placed, seeds, fanouts, False, 1), want)


def test_a_keyed_and_a_plain_batch_of_one_shape_do_not_share_a_graph() -> None:
    gen = torch.Generator().manual_seed(33)
    graph = cpu_tests.random_graph(20000, 200000, gen, torch.int32)
    seeds = cpu_tests.random_seeds(graph.num_nodes, 512, gen)
    with _Switches(True, True), cuda_tests.Placed(graph.indptr, graph.indices, "gpu") as placed:
        for _ in range(3):  # interleaved, each shape captured and replayed
            plain = cuda_tests.sample_cuda(placed, seeds, [10, 5], False, 2)
            cpu_tests.assert_same(plain, ops.sample_neighbors(graph.indptr, graph.indices, seeds, [10, 5], False, 2))
            cpu_tests.assert_same(_keyed_cuda(placed, seeds, [10, 5], False, 2), _keyed_cpu(graph, seeds, [10, 5], False, 2))


@pytest.mark.parametrize("placement,uva_indptr", [("gpu", "gpu"), ("uva", "gpu"), ("uva", "host")])
def test_neighbor_sampler_placements_give_the_cpu_batch(placement: str, uva_indptr: str) -> None:
    from lightning_zerocopy.sampling import NeighborSampler

    gen = torch.Generator().manual_seed(34)
    graph = cpu_tests.random_graph(5000, 60000, gen, torch.int32)
    host = cpu_tests.Graph(*(exclusive_host_copy(t) for t in graph))
    seeds = cpu_tests.random_seeds(graph.num_nodes, 300, gen)
    cpu = NeighborSampler(graph.indptr, graph.indices, graph.edge_perm, fanouts=[10, 5], node_keyed=True)
    gpu = NeighborSampler(host.indptr, host.indices, host.edge_perm, fanouts=[10, 5], placement=placement,
                          uva_indptr=uva_indptr, node_keyed=True)  # fmt: skip
    try:
        a, b = cpu.sample(seeds, 7), gpu.sample(seeds, 7)
        assert torch.equal(a.n_id, b.n_id.cpu()) and torch.equal(a.edge_index, b.edge_index.cpu())
        assert torch.equal(a.e_id, b.e_id.cpu()) and a.num_sampled_nodes == b.num_sampled_nodes
    finally:
        gpu.close()


def test_opcheck_cuda() -> None:
    gen = torch.Generator().manual_seed(35)
    graph = cpu_tests.random_graph(300, 2000, gen, torch.int32)
    args = (graph.indptr.cuda(), graph.indices.cuda(), cpu_tests.random_seeds(300, 20, gen).cuda(), [4, -1, 2],
            False, 31, True)  # fmt: skip
    opcheck(torch.ops.zerocopy.sample_neighbors.default, args)
