"""zerocopy::build_csc against a pure-torch reference, plus every bad input."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import ops


def reference_csc(src, dst, num_nodes, remove_self_loops=False, remove_duplicates=False):
    """Stable sort of the edges by (dst, src); optional filters applied first in input order."""
    pos = torch.arange(src.numel())
    if remove_self_loops:
        keep = src != dst
        src, dst, pos = src[keep], dst[keep], pos[keep]
    if remove_duplicates and src.numel() > 0:
        key = dst * max(num_nodes, 1) + src
        _, inverse = torch.unique(key, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), src.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(src.numel()), reduce="amin")
        keep = torch.zeros(src.numel(), dtype=torch.bool)
        keep[first] = True
        src, dst, pos = src[keep], dst[keep], pos[keep]
    order = torch.sort(src, stable=True).indices
    order = order[torch.sort(dst[order], stable=True).indices]
    indptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return indptr, src[order], pos[order]


def random_edges(num_nodes, num_edges, seed):
    g = torch.Generator().manual_seed(seed)
    # A skewed graph: a few hubs receive many edges, and repeated pairs occur.
    dst = (torch.rand(num_edges, generator=g) ** 3 * num_nodes).long().clamp_max(num_nodes - 1)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    return src, dst


def assert_matches_reference(src, dst, num_nodes, loops, dups):
    got = ops.build_csc(src, dst, num_nodes, loops, dups)
    indptr, indices, perm = reference_csc(src, dst, num_nodes, loops, dups)
    assert got.indptr.dtype == torch.int64 and got.edge_perm.dtype == torch.int64
    assert got.indices.dtype == ops.index_dtype_for(num_nodes)
    assert torch.equal(got.indptr, indptr)
    assert torch.equal(got.indices.long(), indices)
    assert torch.equal(got.edge_perm, perm)
    # edge_perm maps back to the input edges.
    assert torch.equal(src[got.edge_perm], got.indices.long())
    assert torch.equal(torch.repeat_interleave(torch.arange(num_nodes), got.indptr.diff()), dst[got.edge_perm])


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("dups", [False, True])
@pytest.mark.parametrize(
    "num_nodes,num_edges,seed", [(1, 5, 0), (7, 60, 1), (50, 2_000, 2), (3_000, 200_000, 3), (20_011, 150_000, 8)]
)
def test_matches_reference(num_nodes, num_edges, seed, loops, dups):
    src, dst = random_edges(num_nodes, num_edges, seed)
    assert_matches_reference(src, dst, num_nodes, loops, dups)


def test_single_hub_and_isolated_nodes():
    # Every edge enters one node of a graph wide enough for several target buckets.
    num_nodes = 100_003
    src = torch.randint(0, num_nodes, (30_000,), generator=torch.Generator().manual_seed(9))
    dst = torch.full_like(src, num_nodes - 2)
    assert_matches_reference(src, dst, num_nodes, True, True)


def test_directed_graph_keeps_direction():
    # 0 -> 1 and 0 -> 2: node 0 has no incoming edge; nodes 1 and 2 each have source 0.
    csc = ops.build_csc(torch.tensor([0, 0]), torch.tensor([1, 2]), 3)
    assert csc.indptr.tolist() == [0, 0, 1, 2]
    assert csc.indices.tolist() == [0, 0]


def test_ties_keep_input_order_and_dedup_keeps_first():
    src = torch.tensor([4, 2, 4, 2, 4, 3])
    dst = torch.tensor([1, 1, 1, 1, 1, 1])
    csc = ops.build_csc(src, dst, 5, False, False)
    assert csc.indices.tolist() == [2, 2, 3, 4, 4, 4]
    assert csc.edge_perm.tolist() == [1, 3, 5, 0, 2, 4]
    csc = ops.build_csc(src, dst, 5, False, True)
    assert csc.indices.tolist() == [2, 3, 4]
    assert csc.edge_perm.tolist() == [1, 5, 0]


def test_self_loops_removed():
    src = torch.tensor([0, 1, 1, 2, 2])
    dst = torch.tensor([0, 1, 0, 2, 1])
    csc = ops.build_csc(src, dst, 3, True, False)
    assert csc.indptr.tolist() == [0, 1, 2, 2]
    assert csc.indices.tolist() == [1, 2]
    assert csc.edge_perm.tolist() == [2, 4]


def test_empty_graphs():
    empty = torch.empty(0, dtype=torch.long)
    csc = ops.build_csc(empty, empty, 0)
    assert csc.indptr.tolist() == [0] and csc.indices.numel() == 0
    csc = ops.build_csc(empty, empty, 4, True, True)
    assert csc.indptr.tolist() == [0] * 5 and csc.edge_perm.numel() == 0


def test_index_dtype_decision():
    assert ops.index_dtype_for(2**31 - 1) == torch.int32
    assert ops.index_dtype_for(2**31) == torch.int64
    assert ops.index_dtype_for(0) == torch.int32


def test_int64_indices_for_huge_node_count():
    # indptr alone would need 16 GiB at num_nodes > 2^31, so the int64 path is exercised only where memory allows.
    pytest.importorskip("psutil")
    import psutil

    if psutil.virtual_memory().available < 40 * 2**30:
        pytest.skip("needs > 40 GiB free for a num_nodes > 2^31 indptr")
    num_nodes = 2**31 + 5
    src = torch.tensor([num_nodes - 1, 3, 0])
    dst = torch.tensor([num_nodes - 2, num_nodes - 2, 1])
    csc = ops.build_csc(src, dst, num_nodes)
    assert csc.indices.dtype == torch.int64
    assert csc.indices.tolist() == [0, 3, num_nodes - 1]


@pytest.mark.parametrize("name", ["src", "dst"])
@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_out_of_range_ids_name_the_argument(name, bad):
    src, dst = random_edges(10, 100, 4)
    (src if name == "src" else dst)[37] = bad
    with pytest.raises(IndexError, match=rf"`{name}`.*{bad}.*position 37"):
        ops.build_csc(src, dst, 10)


def test_bad_arguments_name_the_argument():
    src, dst = random_edges(10, 100, 5)
    with pytest.raises(ValueError, match="same length"):
        ops.build_csc(src, dst[:-1], 10)
    with pytest.raises(TypeError, match="`src`.*Long"):
        ops.build_csc(src.int(), dst, 10)
    with pytest.raises(TypeError, match="`dst`.*Long"):
        ops.build_csc(src, dst.float(), 10)
    with pytest.raises(ValueError, match="`dst`.*contiguous"):
        ops.build_csc(src, torch.stack([dst, dst], 1)[:, 0], 10)
    with pytest.raises(ValueError, match="`src`.*1-D"):
        ops.build_csc(src.view(10, 10), dst, 10)
    with pytest.raises(ValueError, match="`num_nodes`"):
        ops.build_csc(src, dst, -1)
    with pytest.raises(ValueError, match="`src`.*CPU"):
        ops.build_csc(src.to("meta"), dst, 10)


def test_thread_count_does_not_change_result():
    src, dst = random_edges(500, 50_000, 6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.build_csc(src, dst, 500, True, True)
    finally:
        torch.set_num_threads(threads)
    many = ops.build_csc(src, dst, 500, True, True)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dups", [False, True])
def test_opcheck(dups):
    src, dst = random_edges(40, 300, 7)
    torch.library.opcheck(torch.ops.zerocopy.build_csc.default, (src, dst, 40, True, dups))
