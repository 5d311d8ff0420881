"""node_order: host memory stored in a locality-preserving order, batches still in the dataset's ids.

Every batch built from node-ordered host memory must satisfy PyG's NeighborLoader invariants in ORIGINAL ids
(x == features[n_id], y == labels[n_id], edges are dataset edges e_id, seeds first as planned), while the host
memory itself really is renumbered. CUDA tests (``@pytest.mark.cuda``) check the GPU path builds bitwise the
CPU path's batch from the same node-ordered memory.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

import lightning_zerocopy.data.host.disk_cache as disk_cache_module
import lightning_zerocopy.data.host.share as host_module
from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.disk_cache import build_node_order_cache, node_order_cache_dir
from lightning_zerocopy.data.host.share import share_node_data, shared_node_order
from lightning_zerocopy.data.plan import BatchPlan, PlanItem
from lightning_zerocopy.datasets import PyGNodeDataset, SyntheticGraph
from lightning_zerocopy.datasets.base import NodeData
from lightning_zerocopy.graph.reorder import NodeOrder
from lightning_zerocopy.graph.shared_memory import NpyTensorHandle

NUM_NODES = 700
NUM_EDGES = 6000
FEATURES = 12
ORDERS = ["bfs", "degree"]


def _graph(dtype: torch.dtype = torch.float32) -> NodeData:
    gen = torch.Generator().manual_seed(21)
    src = (torch.rand(NUM_EDGES, generator=gen) ** 2 * NUM_NODES).long()  # skewed: degree order is not the identity
    dst = torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=gen)
    perm = torch.randperm(NUM_NODES, generator=gen)
    return NodeData(
        edge_index=torch.stack([src, dst]),
        x=torch.randn(NUM_NODES, FEATURES, generator=gen).to(dtype),
        y=torch.randint(0, 300, (NUM_NODES,), generator=gen),  # int16 labels on the GPU
        train_idx=perm[:400].sort().values,
        val_idx=perm[400:550].sort().values,
        test_idx=perm[550:].sort().values,
        edge_attr=torch.randn(NUM_EDGES, 3, generator=gen),
    )


def _plan(data: NodeData, batch_size: int = 48) -> BatchPlan:
    return BatchPlan(data.train_idx, batch_size, shuffle=True, seed=7)


def _assert_pyg_batch_in_original_ids(batch: Data, item: PlanItem, data: NodeData, fanouts: list[int]) -> None:
    n_id, e_id, edge_index = batch.n_id.cpu(), batch.e_id.cpu(), batch.edge_index.cpu()
    bs = batch.batch_size
    assert bs == item.batch_size
    assert torch.equal(n_id[:bs], item.seed_ids), "seeds first, in plan order, as original ids"
    assert torch.equal(batch.input_id.cpu(), item.input_id)
    assert n_id.unique().numel() == n_id.numel()
    assert n_id.min() >= 0 and n_id.max() < data.num_nodes
    assert torch.equal(batch.x.cpu(), data.x[n_id]), "x must be features[n_id] in original ids"
    assert torch.equal(batch.y.cpu(), data.y[n_id]), "y must be labels[n_id] in original ids"
    if data.edge_attr is not None:
        assert torch.equal(batch.edge_attr.cpu(), data.edge_attr[e_id])
    # every sampled edge n_id[row] -> n_id[col] is the dataset's edge e_id
    assert torch.equal(n_id[edge_index], data.edge_index[:, e_id])
    hop1 = edge_index[:, : batch.num_sampled_edges[0]]
    assert (hop1[1] < bs).all()
    if fanouts[0] >= 0:
        assert torch.bincount(hop1[1], minlength=bs).max() <= fanouts[0]
    assert sum(batch.num_sampled_nodes) == n_id.numel()
    assert sum(batch.num_sampled_edges) == e_id.numel()


@pytest.fixture(params=[None, "disk"], ids=["in_memory", "disk_cache"])
def where(request, tmp_path: Path):
    return None if request.param is None else tmp_path / "order-cache"


def _share(data: NodeData, kind: str, cache_dir) -> HostGraphHandles:
    return share_node_data(data, node_order=kind, cache_dir=None if cache_dir is None else cache_dir / kind)


# ---------------------------------------------------------------------------------------------- CPU tests


@pytest.mark.parametrize("kind", ORDERS)
def test_batches_are_pyg_batches_in_original_ids(kind, where) -> None:
    data = _graph()
    handles = _share(data, kind, where)
    try:
        assert handles.node_order is not None and handles.node_order.kind == kind
        builder = BatchBuilder(handles, [5, 3])
        assert builder.node_order == kind
        plan = _plan(data)
        for step in range(len(plan)):  # the whole epoch, last (partial) batch included
            item = plan.item(epoch=1, step=step)
            _assert_pyg_batch_in_original_ids(builder.build_batch(item), item, data, [5, 3])
        builder.close()
    finally:
        handles.unlink()


@pytest.mark.parametrize("kind", ORDERS)
def test_host_memory_really_is_renumbered(kind, where) -> None:
    data = _graph()
    handles = _share(data, kind, where)
    try:
        order = handles.node_order.order.open()
        rank = handles.node_order.rank.open()
        assert torch.equal(order.sort().values, torch.arange(NUM_NODES)), "a permutation"
        assert not torch.equal(order, torch.arange(NUM_NODES)), "not the identity on this graph"
        assert torch.equal(rank[order], torch.arange(NUM_NODES)), "rank is the inverse of order"
        features = handles.features.open().data
        assert not torch.equal(features, data.x), "the internal feature table is permuted"
        assert torch.equal(features, data.x[order])
        assert torch.equal(handles.labels.open(), data.y[order])
        graph = handles.graph.open().validate()
        # internal edges, mapped back to original ids, are the dataset's edges at edge_perm (edge ids unchanged)
        dst = torch.repeat_interleave(torch.arange(NUM_NODES), graph.degree())
        internal = torch.stack([graph.indices.long(), dst])
        assert torch.equal(order[internal], data.edge_index[:, graph.edge_perm])
        assert torch.equal(handles.splits["train"].open(), data.train_idx), "splits keep original ids"
        if kind == "degree":
            picked = torch.bincount(graph.indices.long(), minlength=NUM_NODES)  # how often each is an in-neighbor
            assert (picked[:-1] >= picked[1:]).all(), "internal ids by descending out-degree"
    finally:
        handles.unlink()


@pytest.mark.parametrize("kind", ORDERS)
def test_full_fanout_gives_the_same_batch_as_no_node_order(kind) -> None:
    """With every neighbor taken there is no randomness: the batch must be node_order='none''s up to order."""
    data = _graph()
    plain, ordered = share_node_data(data), share_node_data(data, node_order=kind)
    try:
        a_builder, b_builder = BatchBuilder(plain, [-1, -1]), BatchBuilder(ordered, [-1, -1])
        plan = _plan(data, batch_size=16)
        for step in range(3):
            item = plan.item(epoch=0, step=step)
            a, b = a_builder.build_batch(item), b_builder.build_batch(item)
            _assert_pyg_batch_in_original_ids(b, item, data, [-1, -1])
            assert torch.equal(a.n_id[: a.batch_size], b.n_id[: b.batch_size])
            assert torch.equal(a.input_id, b.input_id)
            assert torch.equal(a.n_id.sort().values, b.n_id.sort().values)
            assert torch.equal(a.e_id.sort().values, b.e_id.sort().values)
            assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    finally:
        plain.unlink()
        ordered.unlink()


def test_bad_seed_ids_raise_instead_of_wrapping_around() -> None:
    data = _graph()
    handles = share_node_data(data, node_order="bfs")
    try:
        builder = BatchBuilder(handles, [3])
        for bad in (-1, NUM_NODES):
            item = PlanItem(torch.tensor([0, bad]), torch.tensor([0, 1]), 5, 0, 0, 0)
            with pytest.raises(IndexError, match=f"seed node id {bad} is out of range"):
                builder.build_batch(item)
    finally:
        handles.unlink()


def test_builder_with_node_order_pickles_to_handles() -> None:
    data = _graph()
    handles = share_node_data(data, node_order="degree")
    try:
        builder = BatchBuilder(handles, [4, 2]).open()
        item = _plan(data).item(epoch=0, step=2)
        clone = pickle.loads(pickle.dumps(builder))
        assert clone.resources is None and clone.handles.node_order == handles.node_order
        a, b = builder.build_batch(item), clone.build_batch(item)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x) and torch.equal(a.e_id, b.e_id)
        assert "node_order='degree'" in repr(clone)
        builder.close()
        clone.close()
    finally:
        handles.unlink()


def test_disk_cache_is_built_once_and_serves_mmap_features(tmp_path: Path, monkeypatch) -> None:
    data = _graph()
    calls = []
    compute = disk_cache_module._compute_order  # build_node_order_cache looks it up there, share_node_data in share
    monkeypatch.setattr(disk_cache_module, "_compute_order", lambda g, k: calls.append(k) or compute(g, k))
    monkeypatch.setattr(host_module, "_compute_order", lambda g, k: calls.append(k) or compute(g, k))
    cache_dir = tmp_path / "bfs"
    build_node_order_cache(data, "bfs", cache_dir)
    assert (cache_dir / "meta.json").is_file() and calls == ["bfs"]
    data.x_file = str(tmp_path / "unused-original-x.npy")  # as a file-backed dataset; mmap must not map it
    handles = share_node_data(data, "mmap", node_order="bfs", cache_dir=cache_dir)
    try:
        assert calls == ["bfs"], "the cached order is reused, not recomputed"
        assert isinstance(handles.features.data, NpyTensorHandle)
        assert Path(handles.features.data.path) == cache_dir / "x.npy"
        order = handles.node_order.order.open()
        assert torch.equal(handles.features.open().data, data.x[order])
        item = _plan(data).item(epoch=0, step=0)
        _assert_pyg_batch_in_original_ids(BatchBuilder(handles, [4, 4]).build_batch(item), item, data, [4, 4])
    finally:
        handles.unlink()
    assert cache_dir.exists(), "unlink keeps the files on disk"


def test_an_in_memory_order_given_back_is_not_computed_again(monkeypatch) -> None:
    data = _graph()
    calls = []
    compute = host_module._compute_order
    monkeypatch.setattr(host_module, "_compute_order", lambda g, k: calls.append(k) or compute(g, k))
    first = share_node_data(data, node_order="bfs")
    second = share_node_data(data, node_order="bfs", order=shared_node_order(first))
    try:
        assert calls == ["bfs"]
        assert torch.equal(first.node_order.order.open(), second.node_order.order.open())
        assert torch.equal(first.features.open().data, second.features.open().data)
        plain = share_node_data(data)
        assert shared_node_order(plain) is None
        plain.unlink()
    finally:
        first.unlink()
        second.unlink()
    with pytest.raises(ValueError, match="`order` covers"):
        share_node_data(data, node_order="bfs", order=NodeOrder.from_order(torch.arange(5)))


def test_datamodule_computes_an_in_memory_order_once_across_setups(monkeypatch) -> None:
    data = _graph()
    pyg = Data(edge_index=data.edge_index, x=data.x, y=data.y, train_idx=data.train_idx, val_idx=data.val_idx,
               test_idx=data.test_idx)  # fmt: skip
    calls = []
    compute = host_module._compute_order
    monkeypatch.setattr(host_module, "_compute_order", lambda g, k: calls.append(k) or compute(g, k))
    dm = ZeroCopyDataModule(PyGNodeDataset(pyg), fanouts=[4], batch_size=32, node_order="bfs")
    batches = []
    for stage in ("fit", "test"):  # teardown in between, as the Trainer does
        dm.setup(stage)
        batches.append(next(iter(dm.train_dataloader())))
        dm.teardown(stage)
    assert calls == ["bfs"], "the DataModule keeps its order; no process-wide memo"
    assert torch.equal(batches[0].n_id, batches[1].n_id) and torch.equal(batches[0].x, batches[1].x)


def test_bad_node_order_options_name_the_key(tmp_path: Path) -> None:
    data = _graph()
    with pytest.raises(ValueError, match=r"`node_order` must be 'none', 'bfs' or 'degree'"):
        share_node_data(data, node_order="rcm")  # type: ignore[arg-type]
    data.x_file = str(tmp_path / "x.npy")
    with pytest.raises(ValueError, match=r"`node_order`='bfs' with `feature_storage`='mmap'"):
        share_node_data(data, "mmap", node_order="bfs")
    with pytest.raises(ValueError, match=r"data\.init_args\.node_order"):
        ZeroCopyDataModule(_synthetic(tmp_path), node_order="random")  # type: ignore[arg-type]


def _synthetic(tmp_path: Path) -> SyntheticGraph:
    return SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=str(tmp_path / "cache"))


class SAGE(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, 16)
        self.conv2 = SAGEConv(16, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def training_step(self, data: Data, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(data.x, data.edge_index)[: data.batch_size], data.y[: data.batch_size])

    def validation_step(self, data: Data, batch_idx: int) -> None:
        self(data.x, data.edge_index)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _fit_and_check(tmp_path: Path, accelerator: str, **kwargs) -> list[str]:
    dataset = _synthetic(tmp_path)
    dm = ZeroCopyDataModule(dataset, fanouts=[5, 5], batch_size=128, **kwargs)
    data = dataset.load()
    plan_seeds: list[torch.Tensor] = []
    devices: list[str] = []

    class Check(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            item = trainer.datamodule.plan("train").item(trainer.current_epoch, batch_idx)
            plan_seeds.append(item.seed_ids)
            devices.append(batch.x.device.type)
            _assert_pyg_batch_in_original_ids(batch, item, data, [5, 5])

    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, max_steps=3, limit_val_batches=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path), callbacks=[Check()],
    )  # fmt: skip
    trainer.fit(SAGE(dm.num_features, dm.num_classes), datamodule=dm)
    assert len(plan_seeds) == 3
    assert node_order_cache_dir(dataset, kwargs["node_order"]).is_dir(), "prepare_data cached the relabeled arrays"
    assert not dm._builders, "teardown closed the builders"
    return devices


@pytest.mark.parametrize("kind", ORDERS)
def test_datamodule_fit_with_node_order(tmp_path: Path, kind) -> None:
    pl.seed_everything(0)
    assert _fit_and_check(tmp_path, "cpu", node_order=kind, gather="cpu") == ["cpu"] * 3


# --------------------------------------------------------------------------------------------- CUDA tests

COMBOS = [("cpu", "zerocopy"), ("uva", "cpu"), ("uva", "zerocopy"), ("gpu", "cpu"), ("gpu", "zerocopy")]


@pytest.mark.cuda
@pytest.mark.parametrize("placement, gather", COMBOS)
@pytest.mark.parametrize("kind", ORDERS)
def test_gpu_batch_with_node_order_equals_the_cpu_batch(kind, placement, gather) -> None:
    data = _graph()
    handles = share_node_data(data, node_order=kind)
    try:
        ref_builder = BatchBuilder(handles, [10, 5, 3])
        hot_rows = 50 if gather == "zerocopy" else 0
        builder = BatchBuilder(handles, [10, 5, 3], sampler_placement=placement, gather=gather, hot_rows=hot_rows).open()
        device = torch.device("cuda", torch.cuda.current_device())
        state = builder._gpu
        assert state.order is not None and state.order.device == device and state.order.dtype == torch.int32
        assert torch.equal(state.order.cpu().long(), handles.node_order.order.open())
        plan = _plan(data)
        for step in range(3):
            item = plan.item(epoch=0, step=step)
            batch, ref = builder.build_batch(item), ref_builder.build_batch(item)
            for key in ("x", "y", "edge_index", "n_id", "e_id", "input_id", "edge_attr"):
                assert batch[key].device == device, key
                assert torch.equal(batch[key].cpu(), ref[key]), key
            assert batch.n_id.dtype == torch.int64 and batch.y.dtype == torch.int64
            _assert_pyg_batch_in_original_ids(batch, item, data, [10, 5, 3])
        resources = builder.resources
        builder.close()
        assert resources.closed
        ref_builder.close()
    finally:
        handles.unlink()


@pytest.mark.cuda
def test_gpu_builders_with_and_without_node_order_do_not_share_state() -> None:
    data = _graph()
    plain, ordered = share_node_data(data), share_node_data(data, node_order="bfs")
    try:
        a = BatchBuilder(plain, [5], gather="zerocopy").open()
        b = BatchBuilder(ordered, [5], gather="zerocopy").open()
        assert a.resources is not b.resources and a._gpu.order is None and b._gpu.order is not None
        item = _plan(data).item(epoch=0, step=0)
        _assert_pyg_batch_in_original_ids(b.build_batch(item), item, data, [5])
        a.close()
        b.close()
    finally:
        plain.unlink()
        ordered.unlink()


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_fit_on_gpu_with_node_order_and_the_zerocopy_gather(tmp_path: Path, placement) -> None:
    pl.seed_everything(0)
    devices = _fit_and_check(tmp_path, "gpu", node_order="bfs", gather="zerocopy", sampler_placement=placement)
    assert devices == ["cuda"] * 3
