"""build_batch: PyG NeighborLoader fields and conventions, buffers, and use from another process."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch

from lightning_zerocopy.data.batch import BatchBuilder, max_sampled_nodes
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.share import share_node_data
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.datasets.base import NodeData

NUM_NODES = 400
NUM_EDGES = 3000
FEATURES = 12


def _graph(edge_attr: bool = True) -> NodeData:
    gen = torch.Generator().manual_seed(11)
    edge_index = torch.randint(0, NUM_NODES, (2, NUM_EDGES), generator=gen)
    perm = torch.randperm(NUM_NODES, generator=gen)
    return NodeData(
        edge_index=edge_index,
        x=torch.randn(NUM_NODES, FEATURES, generator=gen),
        y=torch.randint(0, 5, (NUM_NODES,), generator=gen),
        train_idx=perm[:200].sort().values,
        val_idx=perm[200:300].sort().values,
        test_idx=perm[300:].sort().values,
        edge_attr=torch.randn(NUM_EDGES, 3, generator=gen) if edge_attr else None,
    )


@pytest.fixture
def shared():
    data = _graph()
    handles = share_node_data(data)
    yield data, handles
    handles.unlink()


def _item(data: NodeData, step: int = 0, batch_size: int = 32):
    return BatchPlan(data.train_idx, batch_size, shuffle=True, seed=4).item(epoch=0, step=step)


def test_batch_has_neighbor_loader_fields(shared) -> None:
    data, handles = shared
    item = _item(data)
    batch = BatchBuilder(handles, [5, 3]).build_batch(item)
    for key in ("x", "edge_index", "y", "n_id", "e_id", "input_id", "edge_attr"):
        assert key in batch, key
    assert batch.batch_size == item.batch_size == 32
    assert isinstance(batch.num_sampled_nodes, list) and len(batch.num_sampled_nodes) == 3
    assert isinstance(batch.num_sampled_edges, list) and len(batch.num_sampled_edges) == 2
    assert sum(batch.num_sampled_nodes) == batch.num_nodes == batch.n_id.numel()
    assert sum(batch.num_sampled_edges) == batch.edge_index.shape[1]
    assert torch.equal(batch.input_id, item.input_id)


def test_batch_follows_pyg_semantics(shared) -> None:
    data, handles = shared
    fanouts = [5, 3]
    item = _item(data, step=2)
    batch = BatchBuilder(handles, fanouts).build_batch(item)
    bs = batch.batch_size
    # seeds first, in plan order; node ids unique
    assert torch.equal(batch.n_id[:bs], item.seed_ids)
    assert batch.n_id.unique().numel() == batch.n_id.numel()
    # features, labels and edge features are the rows of the sampled ids
    assert torch.equal(batch.x, data.x[batch.n_id])
    assert torch.equal(batch.y, data.y[batch.n_id])
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    # every sampled edge is the dataset edge e_id, with messages flowing edge_index[0] -> edge_index[1]
    global_edges = batch.n_id[batch.edge_index]
    assert torch.equal(global_edges, data.edge_index[:, batch.e_id])
    # hop-1 edges point into the seeds; at most `fanout` sampled in-edges per target
    hop1 = batch.edge_index[:, : batch.num_sampled_edges[0]]
    assert (hop1[1] < bs).all()
    assert torch.bincount(hop1[1], minlength=bs).max() <= fanouts[0]
    hop2 = batch.edge_index[:, batch.num_sampled_edges[0] :]
    assert (hop2[1] >= bs).all() and (hop2[1] < bs + batch.num_sampled_nodes[1]).all()


def test_full_fanout_takes_every_in_edge(shared) -> None:
    data, handles = shared
    item = _item(data)
    batch = BatchBuilder(handles, [-1]).build_batch(item)
    in_edges = torch.isin(data.edge_index[1], item.seed_ids).nonzero().view(-1)
    assert torch.equal(batch.e_id.sort().values, in_edges)


def test_same_item_gives_same_batch_and_batch_seed_matters(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [4, 4])
    item = _item(data)
    a, b = builder.build_batch(item), builder.build_batch(item)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    other = BatchPlan(data.train_idx, 32, shuffle=True, seed=4).item(epoch=1, step=0)
    other = type(item)(item.seed_ids, item.input_id, other.batch_seed, 1, 0, 0)
    assert not torch.equal(builder.build_batch(other).e_id, a.e_id)


def test_out_buffers_are_written_in_place(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3])
    rows = builder.max_nodes(32)
    out = {"x": torch.empty(rows, FEATURES), "y": torch.empty(rows, dtype=torch.int64)}
    batch = builder.build_batch(_item(data), out=out)
    assert batch.x.data_ptr() == out["x"].data_ptr()
    assert batch.y.data_ptr() == out["y"].data_ptr()
    assert torch.equal(batch.x, data.x[batch.n_id])
    with pytest.raises(ValueError, match=r"out\['x'\] has 3 rows"):
        builder.build_batch(_item(data), out={"x": torch.empty(3, FEATURES)})


def test_max_sampled_nodes_bounds() -> None:
    assert max_sampled_nodes(10, [2, 3], 10_000) == 10 + 20 + 60
    assert max_sampled_nodes(10, [2, 3], 50) == 50
    assert max_sampled_nodes(10, [-1], 77) == 77


def test_builder_pickles_without_data(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3]).open()
    blob = pickle.dumps(builder)
    assert len(blob) < 4096, "the pickle must carry handles, not arrays"
    clone = pickle.loads(blob)
    assert not clone.is_open
    item = _item(data)
    assert torch.equal(clone.build_batch(item).n_id, builder.build_batch(item).n_id)


def _build_in_child(builder: BatchBuilder, item, queue) -> None:
    batch = builder.build_batch(item)
    # numpy arrays pickle by value; tensors would go through torch's fd sharing, which needs this process alive
    queue.put({k: batch[k].numpy() for k in ("n_id", "e_id", "x", "y")})


def test_builder_opens_in_another_process(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3])
    item = _item(data, step=1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_build_in_child, args=(builder, item, queue))
    proc.start()
    got = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    expected = builder.build_batch(item)
    for key, value in got.items():
        assert torch.equal(torch.from_numpy(value), expected[key]), key


def test_graph_without_edge_attr_has_no_edge_attr() -> None:
    data = _graph(edge_attr=False)
    handles: HostGraphHandles = share_node_data(data)
    try:
        batch = BatchBuilder(handles, [3]).build_batch(_item(data))
        assert "edge_attr" not in batch
    finally:
        handles.unlink()


def test_fields_match_pygs_own_filter_data(shared) -> None:
    """PyG's NeighborLoader builds its batch with ``filter_data``; given our sample it must agree field by field."""
    from torch_geometric.data import Data
    from torch_geometric.loader.utils import filter_data

    data, handles = shared
    batch = BatchBuilder(handles, [6, 2]).build_batch(_item(data, step=4))
    full = Data(x=data.x, y=data.y, edge_index=data.edge_index, edge_attr=data.edge_attr)
    reference = filter_data(full, batch.n_id, batch.edge_index[0], batch.edge_index[1], batch.e_id)
    for key in ("x", "y", "edge_index", "edge_attr"):
        assert torch.equal(batch[key], reference[key]), key
