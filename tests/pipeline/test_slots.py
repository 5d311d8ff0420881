"""SlotLayout / SlotRing: layout inference, views, copies, growth, capacity bounds, shared host memory."""

from __future__ import annotations

import pytest
import torch
from helpers.pipeline_fakes import FakeSource
from torch_geometric.data import Data

from lightning_zerocopy.pipeline.slots import (
    EDGES,
    NODES,
    SEEDS,
    SlotLayout,
    SlotRing,
    capacity_bound,
    view_batch,
    write_batch,
)


def _batch(step: int = 0, **kw) -> Data:
    src = FakeSource(**kw)
    return src.build_batch(src.plan(0, step))


def _assert_same(a: Data, b: Data) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in b.keys():
        if isinstance(b[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype, key
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_layout_inference_assigns_pyg_axes():
    data = _batch()
    layout = SlotLayout.from_batch(data)
    axes = {f.name: (f.axis, f.var_dim) for f in layout.fields}
    assert axes["x"] == (NODES, 0) and axes["y"] == (NODES, 0) and axes["n_id"] == (NODES, 0)
    assert axes["edge_index"] == (EDGES, 1) and axes["e_id"] == (EDGES, 0)
    assert axes["input_id"] == (SEEDS, 0)
    assert axes["num_sampled_edges"] == ("num_sampled_edges", 0)
    sizes = layout.sizes(data)
    assert sizes[NODES] == data.num_nodes and sizes[EDGES] == data.edge_index.size(1) and sizes[SEEDS] == 16
    assert layout.scalars(data) == {"batch_size": 16, "num_sampled_nodes": data.num_sampled_nodes}


def test_unknown_field_follows_matching_axis_else_its_own():
    data = _batch()
    data.node_score = torch.rand(data.num_nodes, 3)
    data.edge_w = torch.rand(data.edge_index.size(1))
    data.extra = torch.arange(7)
    data.flag = torch.tensor(3)
    layout = SlotLayout.from_batch(data)
    axes = {f.name: f.axis for f in layout.fields}
    assert axes["node_score"] == NODES and axes["edge_w"] == EDGES and axes["extra"] == "extra"
    ring = SlotRing(layout, layout.sizes(data), depth=1)
    write_batch(layout, ring.slots[0], data, layout.sizes(data))
    out = ring.view(0, layout.sizes(data), layout.scalars(data))
    _assert_same(out, data)
    assert out.flag.dim() == 0


def _fits(ring: SlotRing, index: int, sizes) -> bool:
    cap = ring.capacity[index]
    return all(sizes.get(axis, 0) <= cap[axis] for axis in cap)


def test_write_then_view_roundtrip_for_varying_batches():
    first = _batch(0)
    layout = SlotLayout.from_batch(first)
    cap = {axis: 10_000 for axis in layout.axes}
    ring = SlotRing(layout, cap, depth=2)
    for step in range(6):
        data = _batch(step)
        sizes = layout.sizes(data)
        assert _fits(ring, step % 2, sizes)
        write_batch(layout, ring.slots[step % 2], data, sizes)
        _assert_same(ring.view(step % 2, sizes, layout.scalars(data)), data)


def test_cpu_slots_live_in_shared_memory_unless_told_otherwise():
    layout = SlotLayout.from_batch(_batch())
    ring = SlotRing(layout, {NODES: 64, EDGES: 128, SEEDS: 16}, depth=2)
    assert all(t.is_shared() for slot in ring.slots for t in slot.values())
    private = SlotRing(layout, {NODES: 64, EDGES: 128, SEEDS: 16}, depth=1, shared=False)
    assert not any(t.is_shared() for t in private.slots[0].values())


def test_grow_reallocates_only_that_slot_with_headroom():
    data = _batch()
    layout = SlotLayout.from_batch(data)
    ring = SlotRing(layout, {NODES: 8, EDGES: 8, SEEDS: 16}, depth=2, growth=1.5)
    sizes = layout.sizes(data)
    assert not _fits(ring, 1, sizes)
    old0 = ring.slots[0]["x"]
    ring.grow(1, sizes)
    assert _fits(ring, 1, sizes) and not _fits(ring, 0, sizes)
    assert ring.slots[0]["x"] is old0
    assert ring.capacity[1][NODES] >= int(sizes[NODES] * 1.5)
    write_batch(layout, ring.slots[1], data, sizes)
    _assert_same(ring.view(1, sizes, layout.scalars(data)), data)


def test_sizes_rejects_a_batch_that_changes_fields():
    data = _batch()
    layout = SlotLayout.from_batch(data)
    broken = data.clone()
    broken.x = broken.x.double()
    with pytest.raises(ValueError, match="'x'.*float64"):
        layout.sizes(broken)
    missing = data.clone()
    del missing.e_id
    with pytest.raises(ValueError, match="'e_id' is missing"):
        layout.sizes(missing)


def test_capacity_bound_from_fanouts():
    assert capacity_bound(1024, [15, 10, 5]) == {
        NODES: 1024 * (1 + 15 + 150 + 750),
        EDGES: 1024 * (15 + 150 + 750),
        SEEDS: 1024,
    }
    assert capacity_bound(10, [5, 5], num_nodes=100, num_edges=50) == {NODES: 100, EDGES: 50, SEEDS: 10}
    assert capacity_bound(10, [-1, 5]) is None


def test_depth_must_be_positive():
    layout = SlotLayout.from_batch(_batch())
    with pytest.raises(ValueError, match="depth"):
        SlotRing(layout, {}, depth=0)


def test_view_batch_is_views_not_copies():
    data = _batch()
    layout = SlotLayout.from_batch(data)
    ring = SlotRing(layout, layout.sizes(data), depth=1, shared=False)
    sizes = layout.sizes(data)
    write_batch(layout, ring.slots[0], data, sizes)
    view = view_batch(layout, ring.slots[0], sizes, {})
    assert view.x.data_ptr() == ring.slots[0]["x"].data_ptr()


def test_slots_allocated_in_inference_mode_stay_writable():
    """Lightning allocates evaluation slots inside inference mode; the producer writes them outside it."""
    data = _batch()
    layout = SlotLayout.from_batch(data)
    with torch.inference_mode():
        ring = SlotRing(layout, layout.sizes(data), depth=1, shared=False)
    assert not any(t.is_inference() for t in ring.slots[0].values())
    write_batch(layout, ring.slots[0], data, layout.sizes(data))


def test_an_attributes_level_decides_its_axis_when_the_first_batch_has_as_many_nodes_as_edges():
    """A user's edge attribute on a first batch of 5 nodes and 5 edges: its size alone says nodes; the builder's
    levels (``PlanSource.field_levels``) say edges, and along which dimension (``[2, E]``: the last)."""

    def batch(nodes: int, edges: int) -> Data:
        return Data(x=torch.randn(nodes, 2), edge_index=torch.zeros(2, edges, dtype=torch.int64),
                    n_id=torch.arange(nodes), weight=torch.rand(edges), pair_index=torch.zeros(2, edges))  # fmt: skip

    first, later = batch(5, 5), batch(7, 4)
    guessed = SlotLayout.from_batch(first)
    assert {f.name: f.axis for f in guessed.fields}["weight"] == NODES
    # the sizes alone guessed wrong: the nodes axis or pair_index's fixed shape no longer fits (which is found first
    # follows set order)
    with pytest.raises(ValueError, match=r"rows along axis 'nodes', but another field|'pair_index' has shape \(2, 4\)"):
        guessed.sizes(later)
    told = SlotLayout.from_batch(first, {"weight": ("edge", 0), "pair_index": ("edge", 1)})
    axes = {f.name: (f.axis, f.var_dim) for f in told.fields}
    assert axes["weight"] == (EDGES, 0) and axes["pair_index"] == (EDGES, 1)
    sizes = told.sizes(later)
    assert sizes[EDGES] == 4 and sizes[NODES] == 7
    ring = SlotRing(told, sizes, depth=1, shared=False)
    write_batch(told, ring.slots[0], later, sizes)
    _assert_same(ring.view(0, sizes, told.scalars(later)), later)


def test_a_typed_batchs_edge_field_with_index_in_its_name_varies_along_its_last_dimension():
    """PyG's ``HeteroData.__cat_dim__``: ``-1`` for an edge store's field with ``index`` in its name."""
    from lightning_zerocopy.pipeline.slots import flatten_hetero
    from torch_geometric.data import HeteroData

    data = HeteroData()
    data["a"].x, data["a"].pos_index = torch.randn(3, 2), torch.arange(3)
    data["a", "r", "a"].edge_index = torch.zeros(2, 6, dtype=torch.int64)
    data["a", "r", "a"].pair_index = torch.zeros(2, 6, dtype=torch.int64)
    layout = SlotLayout.from_batch(flatten_hetero(data))
    dims = {f.name: f.var_dim for f in layout.fields}
    assert dims == {"n0/x": 0, "n0/pos_index": 0, "e0/edge_index": 1, "e0/pair_index": 1}


def test_a_batch_held_in_a_larger_slot_is_contiguous_as_pygs_loaders_give_it():
    """A slot holds more entries than a batch; every field of the batch viewed in it (``edge_index`` ``[2, E]`` and a
    ``[F, E]`` attribute vary along their last dimension) is contiguous, so ``edge_index.view(-1)`` works as on a
    ``NeighborLoader`` batch. A ``[2, capacity]`` buffer narrowed to ``[2, E]`` was not."""
    small = _batch(0)
    small.edge_feat = torch.rand(3, small.edge_index.size(1))
    layout = SlotLayout.from_batch(small, {"edge_feat": ("edge", 1)})
    sizes = layout.sizes(small)
    grown = {axis: 3 * n + 5 for axis, n in sizes.items()}
    ring = SlotRing(layout, grown, depth=1)
    write_batch(layout, ring.slots[0], small, sizes)
    out = ring.view(0, sizes, layout.scalars(small))
    _assert_same(out, small)
    for key in ("x", "edge_index", "edge_feat", "e_id"):
        assert out[key].is_contiguous(), key
    assert torch.equal(out.edge_index.view(-1), small.edge_index.reshape(-1))
    field = next(f for f in layout.fields if f.name == "edge_index")
    assert field.capacity(ring.slots[0]["edge_index"]) == grown[EDGES]
