"""``zerocopy::pick_neighbors``: one hop of ``sample_neighbors`` without deduplication or relabeling.

Checked against pure torch (each pick is a neighbor of its own target, read from ``indices``; counts per target;
``edge_ends`` as a cumulative count) and against ``sample_neighbors``' one-hop draws (the same keys, so the same picks:
``nbr == n_id[row]``); CUDA placements bitwise the CPU op (cuda-marked).
"""

from __future__ import annotations

import pytest
import torch
from helpers import exclusive_host_copy, load_test_module, opcheck

from lightning_zerocopy import ops

base = load_test_module(__file__, "test_sample_neighbors")

FANOUTS = [1, 3, 70, -1]  # 70 > pick::kFloydMaxPicks: the hash-table paths


def _check_against_torch(graph, targets, fanout, replace, out, ends) -> None:
    degree = (graph.indptr[1:] - graph.indptr[:-1])[targets]
    want = [base.expected_picks(int(d), fanout, replace) for d in degree]
    assert torch.bincount(out.col, minlength=targets.numel()).tolist() == want
    assert bool((out.col[1:] >= out.col[:-1]).all())  # by target
    begin, end = graph.indptr[targets[out.col]], graph.indptr[targets[out.col] + 1]
    assert bool(((out.edge_pos >= begin) & (out.edge_pos < end)).all())  # a neighbor of its own target
    assert torch.equal(out.nbr, graph.indices[out.edge_pos].long())
    cumulative = [0, *torch.tensor(want, dtype=torch.int64).cumsum(0).tolist()]
    assert out.edge_ends.device.type == "cpu" and out.edge_ends.tolist() == [cumulative[e] for e in ends]
    if not replace:
        for t in range(targets.numel()):
            mine = out.edge_pos[out.col == t]
            assert mine.unique().numel() == mine.numel()


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("node_keyed", [False, True])
@pytest.mark.parametrize("fanout", FANOUTS)
def test_picks_are_sample_neighbors_one_hop_draws(index_dtype, replace, node_keyed, fanout) -> None:
    gen = torch.Generator().manual_seed(fanout + 7)
    graph = base.random_graph(400, 6000, gen, index_dtype)
    targets = base.random_seeds(400, 60, gen)
    ends = [0, 13, 13, 41, 60]
    out = ops.pick_neighbors(graph.indptr, graph.indices, targets, fanout, replace, 123, node_keyed, ends)
    _check_against_torch(graph, targets, fanout, replace, out, ends)
    hop = ops.sample_neighbors(graph.indptr, graph.indices, targets, [fanout], replace, 123, node_keyed)
    assert torch.equal(out.nbr, hop.n_id[hop.row]) and torch.equal(out.col, hop.col)
    assert torch.equal(out.edge_pos, hop.edge_pos)


def test_targets_may_repeat_and_draw_by_position_or_by_node() -> None:
    gen = torch.Generator().manual_seed(1)
    graph = base.random_graph(200, 4000, gen)
    hub = int(torch.argmax(graph.indptr[1:] - graph.indptr[:-1]))
    targets = torch.tensor([hub, hub, hub])
    by_position = ops.pick_neighbors(graph.indptr, graph.indices, targets, 5, False, 3, False)
    by_node = ops.pick_neighbors(graph.indptr, graph.indices, targets, 5, False, 3, True)
    _check_against_torch(graph, targets, 5, False, by_position, [])
    picks = lambda out, t: out.edge_pos[out.col == t].tolist()  # noqa: E731
    assert picks(by_position, 0) != picks(by_position, 1)  # each position its own stream
    assert picks(by_node, 0) == picks(by_node, 1) == picks(by_node, 2)  # one node, one stream


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"targets": torch.tensor([0, 500])}, IndexError, r"`targets\[1\]` = 500 is not a node id in \[0, 400\)"),
        ({"targets": torch.tensor([-1])}, IndexError, r"`targets\[0\]` = -1"),
        ({"fanout": 0}, ValueError, "`fanout` must be a positive neighbor count or -1"),
        ({"target_ends": [3, 2]}, ValueError, r"`target_ends\[1\]` = 2 must be in \[3, 4\]"),
        ({"target_ends": [5]}, ValueError, r"`target_ends\[0\]` = 5 must be in \[0, 4\]"),
        ({"targets": torch.tensor([1.0])}, TypeError, "targets"),
    ],
)
def test_bad_input_raises_naming_the_argument(change, error, match) -> None:
    graph = base.random_graph(400, 3000, torch.Generator().manual_seed(0))
    args = dict(indptr=graph.indptr, indices=graph.indices, targets=torch.tensor([1, 2, 3, 4]), fanout=2,
                target_ends=[])  # fmt: skip
    args.update(change)
    with pytest.raises(error, match=match):
        ops.pick_neighbors(**args)


def test_a_bad_neighbor_id_raises() -> None:
    graph = base.random_graph(100, 800, torch.Generator().manual_seed(2))
    indices = graph.indices.clone()
    indices[:] = 100
    target = int(torch.argmax(graph.indptr[1:] - graph.indptr[:-1]))
    with pytest.raises(IndexError, match=r"is not a node id in \[0, 100\)"):
        ops.pick_neighbors(graph.indptr, indices, torch.tensor([target]), 2)


def test_opcheck() -> None:
    gen = torch.Generator().manual_seed(9)
    graph = base.random_graph(300, 2000, gen, torch.int32)
    args = (graph.indptr, graph.indices, base.random_seeds(300, 20, gen), 4, False, 31, False, [5, 20])
    opcheck(torch.ops.zerocopy.pick_neighbors.default, args)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["gpu", "uva"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("node_keyed", [False, True])
@pytest.mark.parametrize("fanout", FANOUTS)
def test_cuda_picks_bitwise_the_cpu_op(placement, replace, node_keyed, fanout) -> None:
    from lightning_zerocopy.graph import register_host_tensor

    gen = torch.Generator().manual_seed(fanout + 11)
    graph = base.random_graph(400, 6000, gen, torch.int32)
    targets = torch.cat([base.random_seeds(400, 50, gen), torch.tensor([3, 3])])  # repeats allowed
    ends = [10, 52]
    cpu = ops.pick_neighbors(graph.indptr, graph.indices, targets, fanout, replace, 5, node_keyed, ends)
    registrations = []
    if placement == "gpu":
        indptr, indices = graph.indptr.cuda(), graph.indices.cuda()
    else:
        indptr, indices = exclusive_host_copy(graph.indptr), exclusive_host_copy(graph.indices)
        registrations = [register_host_tensor(indptr), register_host_tensor(indices)]
    try:
        gpu = ops.pick_neighbors(indptr, indices, targets.cuda(), fanout, replace, 5, node_keyed, ends)
        for name in ("nbr", "col", "edge_pos"):
            t = getattr(gpu, name)
            assert t.is_cuda and torch.equal(t.cpu(), getattr(cpu, name)), name
        assert gpu.edge_ends.device.type == "cpu" and torch.equal(gpu.edge_ends, cpu.edge_ends)
        with pytest.raises(IndexError, match=r"`targets\[1\]` = 400"):
            ops.pick_neighbors(indptr, indices, torch.tensor([0, 400], device="cuda"), fanout, replace, 5)
    finally:
        for r in registrations:
            r.close()
