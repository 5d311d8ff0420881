"""build_batch: PyG NeighborLoader fields and conventions (``Data`` of an untyped graph, ``HeteroData`` of a typed
one, as PyG's hetero NeighborLoader yields them), buffers, and use from another process."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch
from helpers.hetero import make_hetero_data
from helpers.kinds import NODE_KINDS, edges, nodes
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.data.batch import BatchBuilder, max_sampled_nodes
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.share import share_host_data, share_node_data, typed_arrays
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
def node_data() -> NodeData:
    """The graph ``shared`` (``tests/conftest.py``) shares."""
    return _graph()


@pytest.fixture(params=NODE_KINDS, ids=str)
def kind_shared(request):
    """``(kind, data, handles)`` of the untyped graph above or the tiny typed graph (``helpers.hetero``)."""
    kind = request.param
    data = make_hetero_data() if kind.typed else _graph()
    handles = share_host_data(data)
    yield kind, data, handles
    handles.unlink()


def _builder(handles: HostGraphHandles, fanouts: list[int], **kwargs) -> BatchBuilder:
    """A builder with ``fanouts`` (every edge type's, for a typed graph)."""
    if handles.schema.is_typed:
        return BatchBuilder(handles, {et: list(fanouts) for et in handles.edge_types}, **kwargs)
    return BatchBuilder(handles, fanouts, **kwargs)


def _item(data, step: int = 0, batch_size: int = 32):
    size = 8 if isinstance(data.num_nodes, dict) else batch_size  # the typed graph has 20 training papers
    return BatchPlan(data.train_idx, size, shuffle=True, seed=4).item(epoch=0, step=step)


def test_batch_has_neighbor_loader_fields(kind_shared) -> None:
    kind, data, handles = kind_shared
    item = _item(data)
    batch = _builder(handles, [5, 3]).build_batch(item)
    assert isinstance(batch, HeteroData if kind.typed else Data)
    seeds = kind.seeds(batch)
    for key in ("x", "y", "n_id", "input_id", "batch_size"):
        assert key in seeds, key
    assert seeds.batch_size == item.batch_size == (8 if kind.typed else 32)
    assert torch.equal(seeds.input_id, item.input_id)
    assert not kind.typed or "x" not in batch["author"]  # a featureless type: ids only
    for store in nodes(batch).values():
        assert isinstance(store.num_sampled_nodes, list) and len(store.num_sampled_nodes) == 3
        assert sum(store.num_sampled_nodes) == store.num_nodes == store.n_id.numel()
    for store in edges(batch).values():
        for key in ("edge_index", "e_id") + (() if kind.typed else ("edge_attr",)):
            assert key in store, key
        assert isinstance(store.num_sampled_edges, list) and len(store.num_sampled_edges) == 2
        assert sum(store.num_sampled_edges) == store.edge_index.shape[1] == store.e_id.numel()


def test_batch_follows_pyg_semantics(kind_shared) -> None:
    kind, data, handles = kind_shared
    view = typed_arrays(data)
    fanouts = [5, 3]
    item = _item(data, step=2 if not kind.typed else 1)
    batch = _builder(handles, fanouts).build_batch(item)
    seeds = kind.seeds(batch)
    bs = seeds.batch_size
    # seeds first, in plan order; node ids unique per type
    assert torch.equal(seeds.n_id[:bs], item.seed_ids)
    by_type = nodes(batch)
    for node_type, store in by_type.items():
        assert store.n_id.unique().numel() == store.n_id.numel()
        # features are the rows of the sampled ids (a type without features has none)
        if node_type in view.x:
            assert store.x.dtype == torch.float32 and torch.equal(store.x, view.x[node_type][store.n_id])
    assert torch.equal(seeds.y, data.y[seeds.n_id])  # labels of every sampled node of the seeds' type
    if not kind.typed:
        assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    for (src, _, dst), store in edges(batch).items():
        # every sampled edge is the dataset edge e_id, with messages flowing edge_index[0] -> edge_index[1]
        global_edges = torch.stack([by_type[src].n_id[store.edge_index[0]], by_type[dst].n_id[store.edge_index[1]]])
        assert torch.equal(global_edges, view.edge_index[(src, _, dst)][:, store.e_id])
        # hop-1 edges point into the seeds; at most `fanout` sampled in-edges per target (and edge type)
        first = by_type[dst].num_sampled_nodes[0]
        hop1 = store.edge_index[:, : store.num_sampled_edges[0]]
        assert (hop1[1] < first).all()
        if hop1.numel():
            assert torch.bincount(hop1[1]).max() <= fanouts[0]
        # hop-2 edges point into the nodes hop 1 added
        hop2 = store.edge_index[:, store.num_sampled_edges[0] :]
        assert (hop2[1] >= first).all() and (hop2[1] < first + by_type[dst].num_sampled_nodes[1]).all()
    if kind.typed:
        assert batch["institution"].n_id.numel() > 0  # reached through (institution, employs, author) at hop 2


def test_full_fanout_takes_every_in_edge(kind_shared) -> None:
    kind, data, handles = kind_shared
    view = typed_arrays(data)
    item = _item(data)
    batch = _builder(handles, [-1]).build_batch(item)
    for edge_type, store in edges(batch).items():
        if edge_type[2] == view.schema.input_type:  # one hop: the in-edges of the seeds
            in_edges = torch.isin(view.edge_index[edge_type][1], item.seed_ids).nonzero().view(-1)
            assert torch.equal(store.e_id.sort().values, in_edges), edge_type
        else:
            assert store.e_id.numel() == 0


def test_same_item_gives_same_batch_and_batch_seed_matters(kind_shared) -> None:
    kind, data, handles = kind_shared
    builder = _builder(handles, [4, 4])
    item = _item(data)
    a, b = builder.build_batch(item), builder.build_batch(item)
    for store_a, store_b in zip(nodes(a).values(), nodes(b).values()):
        assert torch.equal(store_a.n_id, store_b.n_id)
    for store_a, store_b in zip(edges(a).values(), edges(b).values()):
        assert torch.equal(store_a.edge_index, store_b.edge_index) and torch.equal(store_a.e_id, store_b.e_id)
    other = BatchPlan(data.train_idx, item.batch_size, shuffle=True, seed=4).item(epoch=1, step=0)
    other = type(item)(item.seed_ids, item.input_id, other.batch_seed, 1, 0, 0)
    e_ids = lambda batch: torch.cat([s.e_id for s in edges(batch).values()])  # noqa: E731
    assert not torch.equal(e_ids(builder.build_batch(other)), e_ids(a))


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


def _arrays(batch) -> dict:
    """Every tensor of the batch by (store key, field), as numpy arrays (they pickle by value; tensors would go
    through torch's fd sharing, which needs the sending process alive)."""
    stores = [*batch.node_stores, *batch.edge_stores] if isinstance(batch, HeteroData) else [batch.stores[0]]
    return {(s._key, k): v.numpy() for s in stores for k, v in s.items() if isinstance(v, torch.Tensor)}


def test_builder_pickles_without_data(kind_shared) -> None:
    _, data, handles = kind_shared
    builder = _builder(handles, [5, 3]).open()
    blob = pickle.dumps(builder)
    assert len(blob) < 4096, "the pickle must carry handles, not arrays"
    clone = pickle.loads(blob)
    assert not clone.is_open
    item = _item(data)
    got, want = _arrays(clone.build_batch(item)), _arrays(builder.build_batch(item))
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    clone.close()


def _build_in_child(builder: BatchBuilder, item, queue) -> None:
    queue.put(_arrays(builder.build_batch(item)))


def test_builder_opens_in_another_process(kind_shared) -> None:
    _, data, handles = kind_shared
    builder = _builder(handles, [5, 3])
    item = _item(data, step=1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_build_in_child, args=(builder, item, queue))
    proc.start()
    got = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    expected = _arrays(builder.build_batch(item))
    assert got.keys() == expected.keys() and len(expected) > 0
    for key, value in expected.items():
        assert (got[key] == value).all(), key


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
