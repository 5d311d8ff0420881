"""Host registration on a GPU: tensors that share pages, samplers created and closed in loops, and a handled
cudaError 712 that must not surface in a later, unrelated launch (issue 10 item 13)."""

from __future__ import annotations

import mmap
import random

import pytest
import torch
from helpers import exclusive_host_copy, heap_tensor, page_aligned_heap_bytes

from lightning_zerocopy import ops
from lightning_zerocopy.graph import register_host_tensor
from lightning_zerocopy.graph.host_registration import REGISTRY
from lightning_zerocopy.sampling import NeighborSampler

pytestmark = pytest.mark.cuda

P = mmap.PAGESIZE


@pytest.fixture(autouse=True)
def registry_left_as_found():
    """Every test closes what it registered: the registry ends as it started (other tests may hold ranges)."""
    before = REGISTRY.ranges()
    yield
    assert REGISTRY.ranges() == before


def random_graph(num_nodes: int, num_edges: int, seed: int) -> ops.CSC:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    return ops.build_csc(src, dst, num_nodes)


def assert_same_batch(a, b) -> None:
    for name in ("n_id", "edge_index", "e_id"):
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def unrelated_launches() -> None:
    """Kernel launches that share nothing with registration: torch's own and our GPU sampler's."""
    x = torch.arange(1000, device="cuda") * 2
    assert int(x.sum()) == 999 * 1000
    csc = random_graph(50, 300, seed=99)
    out = ops.sample_neighbors(csc.indptr.cuda(), csc.indices.cuda(), torch.arange(5, device="cuda"), [3, 2])
    torch.cuda.synchronize()
    assert out.n_id.shape[0] >= 5


def test_uva_sampler_over_build_csc_tensors_after_an_earlier_one_closed() -> None:
    """The issue's reproduction: uva samplers over the (heap, page-sharing) tensors of ordinary build_csc calls,
    after earlier samplers registered and closed; then gpu samplers over other graphs."""
    seeds = torch.arange(0, 64)
    for round_ in range(4):
        csc = random_graph(300 + round_, 3000, seed=round_)
        reference = NeighborSampler(csc.indptr, csc.indices, csc.edge_perm, fanouts=[5, 3]).sample(seeds, seed=7)
        uva = NeighborSampler(csc.indptr, csc.indices, csc.edge_perm, fanouts=[5, 3], placement="uva",
                              uva_indptr="host")  # fmt: skip
        assert_same_batch(uva.sample(seeds, seed=7), reference)
        uva.close()
        other = random_graph(500, 4000, seed=100 + round_)
        gpu = NeighborSampler(other.indptr, other.indices, other.edge_perm, fanouts=[4, 4], placement="gpu")
        cpu = NeighborSampler(other.indptr, other.indices, other.edge_perm, fanouts=[4, 4])
        assert_same_batch(gpu.sample(seeds, seed=3), cpu.sample(seeds, seed=3))
        gpu.close()
    unrelated_launches()


def test_samplers_created_in_a_loop_over_the_same_and_different_graphs() -> None:
    graphs = [random_graph(200 + 50 * i, 2000, seed=i) for i in range(3)]
    seeds = torch.arange(0, 40)
    rng = random.Random(1)
    open_samplers = []
    for step in range(24):
        csc = graphs[rng.randrange(len(graphs))]
        placement = rng.choice(["uva", "gpu"])
        sampler = NeighborSampler(csc, fanouts=[6, 2], placement=placement)
        reference = NeighborSampler(csc, fanouts=[6, 2]).sample(seeds, seed=step)
        assert_same_batch(sampler.sample(seeds, seed=step), reference)
        open_samplers.append(sampler)
        if rng.random() < 0.5:  # close an older one (maybe over the same graph) while others still read
            open_samplers.pop(rng.randrange(len(open_samplers))).close()
    for sampler in open_samplers:
        sampler.close()
    unrelated_launches()


def test_small_tensors_sharing_pages_registered_and_closed_in_any_order() -> None:
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    # Small heap tensors: the allocator packs them several to a page.
    tables = [torch.randn(rng.randint(1, 9), 5, generator=gen) for _ in range(200)]
    for trial in range(3):
        regs = [register_host_tensor(t, name=f"t{i}") for i, t in enumerate(tables)]
        order = list(range(len(tables)))
        rng.shuffle(order)
        closed = set(order[: len(order) // 2])
        for i in order[: len(order) // 2]:
            regs[i].close()
        for i, t in enumerate(tables):
            if i in closed:
                continue
            ids = torch.randint(0, t.shape[0], (7,), generator=gen)
            registered = regs[i].tensor  # a page-aligned copy: these heap tensors share pages
            assert torch.equal(ops.gather_rows(registered, ids.cuda()).cpu(), t[ids]), (trial, i)
        for i in order[len(order) // 2 :]:
            regs[i].close()
    unrelated_launches()


def test_uva_sampler_reads_small_csc_tensors_that_share_pages_with_closed_ones() -> None:
    csc = random_graph(100, 600, seed=5)
    seeds = torch.arange(10)
    reference = ops.sample_neighbors(csc.indptr, csc.indices, seeds, [4, 3], False, 11)
    neighbours = [torch.randn(10) for _ in range(50)]  # heap tensors around the CSC arrays
    regs = [register_host_tensor(t) for t in neighbours]
    indptr, indices = csc.indptr.clone(), csc.indices.clone()
    mine = [register_host_tensor(indptr, name="indptr"), register_host_tensor(indices, name="indices")]
    for r in regs:
        r.close()  # the pages the CSC arrays share with them stay registered
    indptr, indices = (registration.tensor for registration in mine)  # what the GPU may read
    out = ops.sample_neighbors(indptr, indices, seeds.cuda(), [4, 3], False, 11)
    for name in ("n_id", "row", "col", "edge_pos"):
        assert torch.equal(getattr(out, name).cpu(), getattr(reference, name)), name
    for r in mine:
        r.close()


def test_host_copies_beside_a_registered_heap_tensor_that_starts_a_page() -> None:
    """Two heap allocations side by side, the first starting a page (one in 64 of torch's do). Registering the first
    must leave the second's pages alone, so host copies into and out of the second work (registered in place with
    its whole last page, they raised 'invalid argument' on an H200, seen as a flaky sampler-loop test)."""
    with page_aligned_heap_bytes(3 * P) as address:
        table = heap_tensor(address, P + 100)
        neighbour = heap_tensor(address + P + 128, P)  # from the first's last page into the next one
        table.copy_(torch.arange(P + 100, dtype=torch.int64).to(torch.uint8))
        with register_host_tensor(table, name="table") as registration:
            neighbour.copy_(torch.full((P,), 7, dtype=torch.uint8, device="cuda"))
            assert int(neighbour.sum()) == 7 * P
            assert int(neighbour.cuda().sum()) == 7 * P
            ids = torch.tensor([0, P + 99, 5], device="cuda")
            assert torch.equal(ops.gather_rows(registration.tensor.view(-1, 1), ids).cpu().view(-1), table[ids.cpu()])
        del table, neighbour
    unrelated_launches()


def test_a_handled_712_does_not_surface_in_a_later_launch() -> None:
    """Pages registered through cudart directly (someone else's) make our cudaHostRegister fail with 712; the
    registry skips them, and the error must be cleared right there, not reported by the next launch."""
    table = exclusive_host_copy(torch.randn(4 * P // 4, dtype=torch.float32))  # 4 pages of its own mapping
    cudart = torch.cuda.cudart()
    torch.cuda.init()
    foreign = table.data_ptr() + P
    assert int(cudart.cudaHostRegister(foreign, 3 * P, 0x01 | 0x02)) == 0
    try:
        registration = register_host_tensor(table)  # one call over 4 pages: 712, skipped and cleared
        unrelated_launches()
        registration.close()
        pieces = register_host_tensor(table, chunk_bytes=P)  # page 0 ours, pages 1-3 foreign (712 each)
        assert pieces.chunks == [(table.data_ptr(), P)]
        unrelated_launches()
        ids = torch.arange(0, table.numel(), 97)
        assert torch.equal(ops.gather_rows(table.view(-1, 1), ids.cuda()).cpu(), table.view(-1, 1)[ids])
        pieces.close()
        unrelated_launches()
    finally:
        assert int(cudart.cudaHostUnregister(foreign)) == 0
