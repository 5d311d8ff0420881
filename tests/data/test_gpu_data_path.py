"""The GPU data path of BatchBuilder / ZeroCopyDataModule: sampler placement, zero-copy gather, hot rows.

CPU tests check option validation, the errors a CPU-only machine gives (naming the YAML key), pickling and
the device-agnostic helpers. CUDA tests (``@pytest.mark.cuda``, run by ``scripts/gpu_check.sh`` with
``REQUIRE_CUDA=1``) check that every (sampler_placement, gather) combination builds on the GPU bitwise the
batch the CPU path builds for the same plan item, that CUDA ``out`` buffers are written in place, that hot
rows change nothing but where rows come from, and a short Lightning fit with the zero-copy gather.
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

import lightning_zerocopy.data.resources as resources_module
import lightning_zerocopy.graph.reorder as reorder_module
import lightning_zerocopy.data.gpu_options as gpu_options_module
from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.resources import DeviceResources
from lightning_zerocopy.graph.reorder import most_frequent_neighbors
from lightning_zerocopy.graph.schema import NODE
from lightning_zerocopy.data.host.share import share_node_data
from lightning_zerocopy.data.plan import BatchPlan
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.datasets.base import NodeData

NUM_NODES = 3000
NUM_EDGES = 30000
FEATURES = 13  # odd width: rows are not 16-byte aligned
CUDA_BUILD = torch.version.cuda is not None


def _graph(dtype: torch.dtype = torch.float32, num_classes: int = 7) -> NodeData:
    gen = torch.Generator().manual_seed(5)
    # power-law-ish sources so that some rows are much hotter than others
    src = (torch.rand(NUM_EDGES, generator=gen) ** 3 * NUM_NODES).long()
    dst = torch.randint(0, NUM_NODES, (NUM_EDGES,), generator=gen)
    perm = torch.randperm(NUM_NODES, generator=gen)
    return NodeData(
        edge_index=torch.stack([src, dst]),
        x=torch.randn(NUM_NODES, FEATURES, generator=gen).to(dtype),
        y=torch.randint(0, num_classes, (NUM_NODES,), generator=gen),
        train_idx=perm[:1500].sort().values,
        val_idx=perm[1500:2200].sort().values,
        test_idx=perm[2200:].sort().values,
        edge_attr=torch.randn(NUM_EDGES, 3, generator=gen),
    )


@pytest.fixture
def node_data() -> NodeData:
    """The graph ``shared`` (``tests/conftest.py``) shares."""
    return _graph()


def _item(data: NodeData, step: int = 0, batch_size: int = 64):
    return BatchPlan(data.train_idx, batch_size, shuffle=True, seed=9).item(epoch=1, step=step)


def _datamodule(tmp_path: Path, **kwargs) -> ZeroCopyDataModule:
    dataset = SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=str(tmp_path / "cache"))
    kwargs.setdefault("fanouts", [5, 5])
    kwargs.setdefault("batch_size", 128)
    return ZeroCopyDataModule(dataset, **kwargs)


def _trainer(tmp_path: Path, accelerator: str = "cpu", **kwargs) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(accelerator=accelerator, devices=1, default_root_dir=str(tmp_path), **kwargs)


class SAGE(pl.LightningModule):
    """A PyG-style module (as written for NeighborLoader batches)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, 32)
        self.conv2 = SAGEConv(32, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def training_step(self, data: Data, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(data.x, data.edge_index)[: data.batch_size], data.y[: data.batch_size])
        self.log("train_loss", loss, batch_size=data.batch_size)
        return loss

    def validation_step(self, data: Data, batch_idx: int) -> None:
        acc = (self(data.x, data.edge_index)[: data.batch_size].argmax(-1) == data.y[: data.batch_size]).float().mean()
        self.log("val_acc", acc, batch_size=data.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


# ---------------------------------------------------------------------------------------------- CPU tests


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"sampler_placement": "tpu"}, ValueError, "sampler_placement"),
        ({"gather": "dma"}, ValueError, "gather"),
        ({"gather": "zerocopy", "gather_mode": "random"}, ValueError, "gather_mode"),
        ({"gather": "zerocopy", "hot_rows": -1}, ValueError, "hot_rows"),
        ({"gather": "zerocopy", "hot_rows": 0.5}, TypeError, "hot_rows"),
        ({"hot_rows": 10}, ValueError, "gather='zerocopy'"),
        ({"gather": "zerocopy", "device": -1}, ValueError, "device"),
        ({"num_threads": 0}, ValueError, "num_threads"),
    ],
)
def test_builder_rejects_bad_options_naming_them(shared, kwargs, error, words) -> None:
    _, handles = shared
    with pytest.raises(error, match=words):
        BatchBuilder(handles, [5, 3], **kwargs)


def test_builder_options_pickle_and_decide_nothing_before_open(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3], sampler_placement="uva", gather="zerocopy", gather_mode="sorted", hot_rows=50, device=0)
    assert builder.on_gpu and not builder.is_open
    with pytest.raises(RuntimeError, match="open"):
        _ = builder.device
    clone = pickle.loads(pickle.dumps(builder))
    assert (clone.sampler_placement, clone.gather, clone.gather_mode, clone.hot_rows, clone.device_index) == (
        "uva", "zerocopy", "sorted", 50, 0,
    )  # fmt: skip
    # a host builder opened here still pickles to handles only, and keeps working after close() + reopen
    host = BatchBuilder(handles, [5, 3]).open()
    assert not host.on_gpu and host.device == torch.device("cpu")
    assert pickle.loads(pickle.dumps(host)).resources is None
    first = host.build_batch(_item(data))
    host.close()
    host.close()  # idempotent
    assert not host.is_open
    again = host.build_batch(_item(data))  # the names still exist here: maps them again
    assert torch.equal(first.n_id, again.n_id) and torch.equal(first.x, again.x)
    host.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a CUDA GPU")
@pytest.mark.parametrize("kwargs", [{"gather": "zerocopy"}, {"sampler_placement": "gpu"}, {"sampler_placement": "uva"}])
def test_gpu_builder_without_cuda_fails_clearly(shared, kwargs) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3], **kwargs)
    with pytest.raises(RuntimeError, match="CUDA GPU.*use 'cpu'"):
        builder.build_batch(_item(data))
    builder.close()


def test_out_buffers_on_another_device_are_left_alone(shared) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [5, 3])
    rows = builder.max_nodes(64)
    out = {"x": torch.empty(rows, FEATURES, device="meta"), "y": torch.full((rows,), -7, dtype=torch.int64)}
    batch = builder.build_batch(_item(data), out=out)
    assert batch.x.device.type == "cpu" and torch.equal(batch.x, data.x[batch.n_id])
    assert batch.y.data_ptr() == out["y"].data_ptr()  # same device: written in place
    assert torch.equal(out["y"][: batch.num_nodes], data.y[batch.n_id])


def test_hot_rows_are_the_most_frequent_neighbors(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(3)
    indices = (torch.rand(5000, generator=gen) ** 4 * 300).to(torch.int32)
    monkeypatch.setattr(reorder_module, "_COUNT_CHUNK", 777)  # several chunks
    hot = most_frequent_neighbors(indices, 300, 20)
    counts = torch.bincount(indices.long(), minlength=300)
    assert hot.dtype == torch.int64 and hot.numel() == 20 and hot.unique().numel() == 20
    assert counts[hot].min() >= counts.sort(descending=True).values[19]
    assert (counts[hot][:-1] >= counts[hot][1:]).all(), "most frequent first"
    assert most_frequent_neighbors(indices, 300, 10_000).numel() == 300  # capped at the number of nodes


def test_compact_label_dtype() -> None:
    compact = resources_module._compact_int_dtype
    assert compact(torch.tensor([0, 5, 127])) == torch.int8
    assert compact(torch.tensor([-1, 0, 171])) == torch.int16
    assert compact(torch.tensor([0, 70_000])) == torch.int32
    assert compact(torch.tensor([-(2**40)])) == torch.int64


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"sampler_placement": "tpu"}, "data.init_args.sampler_placement"),
        ({"gather": "dma"}, "data.init_args.gather"),
        ({"gather_mode": "random"}, "data.init_args.gather_mode"),
        ({"hot_rows": -3}, "data.init_args.hot_rows"),
        ({"gather": "cpu", "hot_rows": 100}, "data.init_args.hot_rows=100"),
    ],
)
def test_datamodule_bad_gpu_options_name_the_key(tmp_path: Path, kwargs, words) -> None:
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        _datamodule(tmp_path, **kwargs)


@pytest.mark.skipif(CUDA_BUILD, reason="checks the error of a CPU-only torch build")
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"sampler_placement": "gpu"}, "data.init_args.sampler_placement='gpu' needs a CUDA GPU"),
        ({"sampler_placement": "uva"}, "data.init_args.sampler_placement='uva' needs a CUDA GPU"),
        ({"gather": "zerocopy"}, "data.init_args.gather='zerocopy' needs a CUDA GPU"),
    ],
)
def test_datamodule_gpu_options_on_a_cpu_only_build_name_the_key(tmp_path: Path, kwargs, words) -> None:
    with pytest.raises(ValueError, match=words) as info:
        _datamodule(tmp_path, **kwargs)
    assert "use 'cpu'" in str(info.value)


@pytest.mark.parametrize("kwargs", [{"sampler_placement": "gpu"}, {"gather": "zerocopy", "hot_rows": 5}])
def test_datamodule_gpu_options_on_a_cpu_trainer_fail_before_building(tmp_path: Path, monkeypatch, kwargs) -> None:
    monkeypatch.setattr(gpu_options_module, "cuda_build_problem", lambda: None)  # as on a GPU machine
    dm = _datamodule(tmp_path, **kwargs)
    built = []
    monkeypatch.setattr(dm._host_copy, "share", lambda: built.append(1))
    trainer = _trainer(tmp_path, max_steps=1)
    key = "sampler_placement='gpu'" if "sampler_placement" in kwargs else "gather='zerocopy'"
    with pytest.raises(ValueError, match=f"data.init_args.{key}.*the trainer runs on 'cpu'.*accelerator='gpu'"):
        trainer.fit(SAGE(16, 4), datamodule=dm)
    assert not built, "the error comes before any data is built"


def test_auto_gather_on_a_cpu_trainer_builds_host_batches(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path, gather="auto")
    seen = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(batch.x.device.type)

    trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=0, callbacks=[Record()])
    trainer.fit(SAGE(dm.num_features, dm.num_classes), datamodule=dm)
    assert seen == ["cpu", "cpu"]
    assert dm._gpu.gather == "cpu"
    assert not dm._builders, "teardown closes and drops the builders"


def test_auto_gather_with_hot_rows_on_a_cpu_trainer_names_the_key(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path, hot_rows=10)  # gather='auto' -> 'cpu' on this trainer
    with pytest.raises(ValueError, match=r"data\.init_args\.hot_rows=10"):
        _trainer(tmp_path, max_steps=1).fit(SAGE(16, 4), datamodule=dm)


def test_transfer_batch_to_device_does_not_copy_what_is_there(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path)
    dm.setup("fit")
    try:
        batch = next(iter(dm.train_dataloader()))
        pointers = {key: batch[key].data_ptr() for key in ("x", "y", "edge_index", "n_id")}
        moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        assert {key: moved[key].data_ptr() for key in pointers} == pointers
        assert dm.batch_device_type == "cpu"
    finally:
        dm.teardown("fit")


# --------------------------------------------------------------------------------------------- CUDA tests

def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (so -0.0 and NaN payloads count in a comparison)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


COMBOS = [("cpu", "zerocopy"), ("uva", "cpu"), ("uva", "zerocopy"), ("gpu", "cpu"), ("gpu", "zerocopy")]


def _assert_same_batch(gpu_batch: Data, ref: Data, data: NodeData, device: torch.device,
                       x_dtype: torch.dtype) -> None:
    for key in ("x", "y", "edge_index", "n_id", "e_id", "input_id", "edge_attr"):
        assert gpu_batch[key].device == device, key
    assert torch.equal(gpu_batch.n_id.cpu(), ref.n_id)
    assert torch.equal(gpu_batch.edge_index.cpu(), ref.edge_index)
    assert torch.equal(gpu_batch.e_id.cpu(), ref.e_id)
    assert torch.equal(gpu_batch.input_id.cpu(), ref.input_id)
    assert gpu_batch.batch_size == ref.batch_size
    assert gpu_batch.num_sampled_nodes == ref.num_sampled_nodes
    assert gpu_batch.num_sampled_edges == ref.num_sampled_edges
    n_id = gpu_batch.n_id.cpu()
    x = gpu_batch.x.cpu()
    expected = data.x[n_id].to(x_dtype)  # bf16 -> fp32 is exact: the cast may run on either side of the copy
    assert x.dtype == x_dtype and torch.equal(_bits(x), _bits(expected)), "x must be bitwise features[n_id] in x_dtype"
    assert ref.x.dtype == x_dtype and torch.equal(_bits(ref.x), _bits(expected)), "the CPU builder's x, likewise"
    assert gpu_batch.y.dtype == torch.int64 and torch.equal(gpu_batch.y.cpu(), data.y[n_id])
    assert torch.equal(gpu_batch.edge_attr.cpu(), data.edge_attr[gpu_batch.e_id.cpu()])


@pytest.mark.cuda
@pytest.mark.parametrize("placement, gather", COMBOS)
@pytest.mark.parametrize("dtype, x_dtype", [(torch.float32, "float32"), (torch.bfloat16, "float32"),
                                            (torch.bfloat16, None)])  # fmt: skip
def test_gpu_batch_equals_the_cpu_batch(placement, gather, dtype, x_dtype) -> None:
    """The batch on the GPU equals the CPU builder's, and ``x`` comes in the builder's ``x_dtype`` (float32 by
    default, whatever the table stores; ``None``: the table's dtype)."""
    data = _graph(dtype, num_classes=300)  # labels need int16 on the GPU
    handles = share_node_data(data)
    want_dtype = dtype if x_dtype is None else getattr(torch, x_dtype)
    try:
        ref_builder = BatchBuilder(handles, [10, 5, 3], x_dtype=x_dtype)
        builder = BatchBuilder(handles, [10, 5, 3], sampler_placement=placement, gather=gather, x_dtype=x_dtype).open()
        device = torch.device("cuda", torch.cuda.current_device())
        assert builder.device == device
        for step in range(3):
            item = _item(data, step=step)
            _assert_same_batch(builder.build_batch(item), ref_builder.build_batch(item), data, device, want_dtype)
        resources = builder.resources
        builder.close()
        builder.close()  # idempotent
        assert resources.closed, "a builder opened without resources closes the private ones it made"
        ref_builder.close()
    finally:
        handles.unlink()


@pytest.mark.cuda
@pytest.mark.parametrize("gather_mode", ["sorted", "staged"])
@pytest.mark.parametrize("placement, gather", COMBOS)
def test_cuda_out_buffers_are_written_in_place_on_a_side_stream(shared, placement, gather, gather_mode) -> None:
    data, handles = shared
    builder = BatchBuilder(handles, [10, 5], sampler_placement=placement, gather=gather, gather_mode=gather_mode).open()
    item = _item(data, step=1)
    rows = builder.max_nodes(item.batch_size)
    edges = item.batch_size * 10 + item.batch_size * 11 * 5
    out = {
        "x": torch.full((rows, FEATURES), float("nan"), device="cuda"),
        "y": torch.full((rows,), -1, dtype=torch.int64, device="cuda"),
        "edge_attr": torch.full((edges, 3), float("nan"), device="cuda"),
    }
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        batch = builder.build_batch(item, out=out)
    side.synchronize()
    for key in ("x", "y", "edge_attr"):
        assert batch[key].data_ptr() == out[key].data_ptr(), f"{key} must be a view of out[{key!r}]"
    n_id = batch.n_id.cpu()
    assert torch.equal(out["x"][: n_id.numel()].cpu(), data.x[n_id])
    assert torch.equal(out["y"][: n_id.numel()].cpu(), data.y[n_id])
    assert torch.equal(out["edge_attr"][: batch.e_id.numel()].cpu(), data.edge_attr[batch.e_id.cpu()])
    assert torch.isnan(out["x"][n_id.numel() :]).all(), "rows past the batch are untouched"
    builder.close()


@pytest.mark.cuda
@pytest.mark.parametrize("hot_mode", ["direct", "staged"])
@pytest.mark.parametrize("placement", ["cpu", "gpu"])
def test_hot_rows_give_identical_batches(shared, placement, hot_mode) -> None:
    data, handles = shared
    plain = BatchBuilder(handles, [10, 5], sampler_placement=placement, gather="zerocopy", gather_mode="direct").open()
    hot = BatchBuilder(handles, [10, 5], sampler_placement=placement, gather="zerocopy", gather_mode=hot_mode, hot_rows=400).open()
    table = hot._gpu.features[NODE]
    assert table.num_hot_rows == 400
    counts = torch.bincount(handles.graph.open().indices.long(), minlength=NUM_NODES)
    cached = (table._cache_slot >= 0).nonzero().view(-1).cpu()
    assert cached.numel() == 400 and counts[cached].min() >= counts.sort(descending=True).values[399]
    hits = 0
    for step in range(4):
        item = _item(data, step=step)
        a, b = plain.build_batch(item), hot.build_batch(item)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x) and torch.equal(b.x.cpu(), data.x[b.n_id.cpu()])
        hits += int((table._cache_slot[b.n_id] >= 0).sum())
    assert hits > 0, "the batches read some rows from the cache"
    plain.close()
    hot.close()


@pytest.mark.cuda
def test_builders_opened_with_one_resources_share_the_placement(shared) -> None:
    data, handles = shared
    resources = DeviceResources(handles)
    train = BatchBuilder(handles, [10, 5], sampler_placement="gpu", gather="zerocopy", hot_rows=100).open(resources)
    evaluation = BatchBuilder(handles, [-1], sampler_placement="gpu", gather="zerocopy", hot_rows=100).open(resources)
    assert train._gpu.features.keys() == evaluation._gpu.features.keys() == {NODE}
    assert train._gpu.features[NODE] is evaluation._gpu.features[NODE], "one zero-copy table per feature"
    assert train._gpu.labels is evaluation._gpu.labels
    assert train._gpu.sampler.indices is evaluation._gpu.sampler.indices, "one GPU copy of the topology"
    train.close()
    batch = evaluation.build_batch(_item(data))  # the owner keeps them: still registered and cached
    assert torch.equal(batch.x.cpu(), data.x[batch.n_id.cpu()])
    evaluation.close()
    assert not resources.closed, "builders never close resources they were given"
    resources.close()
    assert resources.closed and not resources._registrations and not resources._tables


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cpu", "uva"])
def test_fit_on_gpu_with_the_zerocopy_gather(tmp_path: Path, placement) -> None:
    pl.seed_everything(0)
    dm = _datamodule(tmp_path, sampler_placement=placement, gather="auto", hot_rows=200, eval_fanouts=[-1])
    seen: list[tuple[str, int, int]] = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append((batch.x.device.type, batch.y.device.type, batch.edge_index.device.type))

    losses: list[float] = []

    class Track(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]))

    opened: list[DeviceResources] = []

    class Grab(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            opened.append(trainer.datamodule.resources)

    trainer = _trainer(tmp_path, accelerator="gpu", max_epochs=3, limit_val_batches=2, callbacks=[Record(), Track(), Grab()])
    trainer.fit(SAGE(dm.num_features, dm.num_classes), datamodule=dm)
    assert dm._gpu.gather == "zerocopy"
    assert seen and all(s == ("cuda", "cuda", "cuda") for s in seen)
    steps = trainer.num_training_batches
    assert trainer.global_step == 3 * steps
    assert sum(losses[-steps:]) < sum(losses[:steps]), "training must reduce the loss"
    assert opened and opened[0].closed and dm.resources is None, "teardown releases the GPU state and registrations"


@pytest.mark.cuda
def test_transfer_keeps_gpu_batches_in_place(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path, gather="zerocopy")
    dm.setup("fit")
    resources = dm.resources
    try:
        batch = next(iter(dm.train_dataloader()))
        assert dm.batch_device_type == "cuda"
        pointers = {key: batch[key].data_ptr() for key in ("x", "y", "edge_index", "n_id", "input_id")}
        moved = dm.transfer_batch_to_device(batch, torch.device("cuda", torch.cuda.current_device()), 0)
        assert {key: moved[key].data_ptr() for key in pointers} == pointers
    finally:
        dm.teardown("fit")
    assert resources.closed and dm.resources is None
