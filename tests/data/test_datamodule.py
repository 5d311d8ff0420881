"""ZeroCopyDataModule as a drop-in for PyG's LightningNodeData; loaders; resume mid-epoch. What the node DataModules
do alike for untyped and typed graphs is checked on both (``kind``: ``helpers.kinds``)."""

from __future__ import annotations

import os
import pickle
from collections import Counter
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from helpers.kinds import NODE_KINDS, edges, fields, nodes
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import trim_to_layer

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.datasets import SyntheticGraph


class PyGStyleSAGE(pl.LightningModule):
    """Written for PyG's LightningNodeData/NeighborLoader, knows nothing about lightning-zerocopy."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 32) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)

    def training_step(self, data: Data, batch_idx: int) -> torch.Tensor:
        y_hat = self(data.x, data.edge_index)[: data.batch_size]
        y = data.y[: data.batch_size]
        loss = F.cross_entropy(y_hat, y)
        self.log("train_loss", loss, batch_size=data.batch_size)
        return loss

    def validation_step(self, data: Data, batch_idx: int) -> None:
        y_hat = self(data.x, data.edge_index)[: data.batch_size]
        acc = (y_hat.argmax(-1) == data.y[: data.batch_size]).float().mean()
        self.log("val_acc", acc, batch_size=data.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class RecordBatches(Callback):
    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen[(trainer.current_epoch, batch_idx)] = (batch.n_id.clone(), batch.e_id.clone())


def _datamodule(tmp_path: Path, **kwargs) -> ZeroCopyDataModule:
    dataset = SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=str(tmp_path / "cache"))
    kwargs.setdefault("fanouts", [5, 5])
    kwargs.setdefault("batch_size", 128)
    return ZeroCopyDataModule(dataset, **kwargs)


def _trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    return pl.Trainer(accelerator="cpu", devices=1, default_root_dir=str(tmp_path), **kwargs)


def _lzc_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"lzc-{os.getpid()}-")} if os.path.isdir("/dev/shm") else set()


def test_pyg_style_module_trains_unchanged(tmp_path: Path) -> None:
    pl.seed_everything(0)
    dm = _datamodule(tmp_path)
    model = PyGStyleSAGE(dm.num_features, dm.num_classes)
    losses: list[float] = []

    class Track(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]))

    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[Track()], limit_val_batches=2)
    trainer.fit(model, datamodule=dm)
    steps_per_epoch = trainer.num_training_batches
    assert trainer.global_step == 3 * steps_per_epoch
    assert sum(losses[-steps_per_epoch:]) < sum(losses[:steps_per_epoch]), "training must reduce the loss"
    assert not _lzc_segments(), "shared segments must be unlinked once mapped"


def test_loaders_have_lengths_and_no_worker_processes(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path, batch_size=100, eval_batch_size=250)
    dm.prepare_data()
    dm.setup("fit")
    try:
        train, val, test, predict = dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()
        assert all(isinstance(loader, PlanLoader) for loader in (train, val, test, predict))
        n_train = int(1500 * 0.6)
        assert len(train) == -(-n_train // 100)
        assert len(val) == -(-300 // 250)
        batches = list(val)
        assert len(batches) == len(val)
        assert torch.equal(torch.cat([b.n_id[: b.batch_size] for b in batches]), dm.plan("val").input_nodes)
        assert not _lzc_segments()
    finally:
        dm.teardown("fit")


def test_transfer_batch_to_device_keeps_the_batch(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert isinstance(moved, Data) and moved.batch_size == batch.batch_size
    assert torch.equal(moved.x, batch.x)
    dm.teardown("fit")


class _RecordIds(Callback):
    """Every training batch's node ids per type, its seeds and each edge type's edge ids, by ``(epoch, batch_idx)``."""

    def __init__(self, kind) -> None:
        self.kind, self.seen = kind, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        seeds = self.kind.seeds(batch)
        ids = {("n_id", t): s.n_id.clone() for t, s in nodes(batch).items()}
        ids.update({("e_id", et): s.e_id.clone() for et, s in edges(batch).items()})
        self.seen[(trainer.current_epoch, batch_idx)] = dict(ids, seeds=seeds.n_id[: seeds.batch_size].clone())


def _fit_kind(tmp_path: Path, kind, dm, callbacks: list, ckpt_path=None) -> pl.Trainer:
    pl.seed_everything(0)
    trainer = _trainer(tmp_path, max_epochs=2, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(kind.model(dm), datamodule=dm, ckpt_path=ckpt_path)
    return trainer


def _first_run(tmp_path: Path, kind) -> tuple[_RecordIds, int]:
    record = _RecordIds(kind)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    trainer = _fit_kind(tmp_path, kind, kind.datamodule(batch_size=3), [record, ckpt])
    assert trainer.num_training_batches == 7  # 20 training nodes, 3 a batch: not a multiple of the checkpoints' 4
    return record, trainer.num_training_batches


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_resume_mid_epoch_trains_the_remaining_batches_unchanged(tmp_path: Path, kind) -> None:
    record, steps_per_epoch = _first_run(tmp_path, kind)
    resume_step = 8  # epoch 1, batch 1: mid-epoch
    resumed = _RecordIds(kind)
    _fit_kind(tmp_path, kind, kind.datamodule(batch_size=3), [resumed], tmp_path / "ckpt" / f"step={resume_step}.ckpt")
    expected = {key: v for key, v in record.seen.items() if key[0] * steps_per_epoch + key[1] >= resume_step}
    assert sorted(resumed.seen) == sorted(expected) and len(expected) == 6
    for key, ids in expected.items():
        for name, value in ids.items():
            assert torch.equal(resumed.seen[key][name], value), (key, name)


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_resume_with_another_batch_size_trains_each_remaining_seed_once(tmp_path: Path, kind) -> None:
    record, _ = _first_run(tmp_path, kind)
    resume_step = 8  # epoch 1 trained its batch 0 (3 seeds) before the checkpoint
    resumed = _RecordIds(kind)
    _fit_kind(tmp_path, kind, kind.datamodule(batch_size=5), [resumed], tmp_path / "ckpt" / f"step={resume_step}.ckpt")
    epoch_seeds = [int(s) for (epoch, _), f in record.seen.items() if epoch == 1 for s in f["seeds"]]
    before = [int(s) for s in record.seen[(1, 0)]["seeds"]]
    after = [int(s) for (epoch, _), f in resumed.seen.items() if epoch == 1 for s in f["seeds"]]
    counts = Counter(before + after)
    assert set(counts) == set(epoch_seeds) and len(counts) == 20 and max(counts.values()) == 1
    assert max(f["seeds"].numel() for (epoch, _), f in resumed.seen.items() if epoch == 1) <= 5


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_same_seed_same_batches_and_the_builder_pickles(kind) -> None:
    first, again = kind.datamodule(), kind.datamodule()
    first.setup("fit")
    again.setup("fit")
    try:
        for a, b in zip(first.train_dataloader(), again.train_dataloader()):
            want = fields(a)
            assert fields(b).keys() == want.keys()
            for key, value in fields(b).items():
                assert torch.equal(value, want[key]) if isinstance(value, torch.Tensor) else value == want[key], key
        builder = pickle.loads(pickle.dumps(first.builder("train")))
        assert not builder.is_open
        item = first.plan("train").item(0, 1)
        one = fields(first.builder("train").open(first.resources).build_batch(item))
        two = fields(builder.open(first.resources).build_batch(item))
        assert one.keys() == two.keys() and all(torch.equal(two[k], v) for k, v in one.items() if isinstance(v, torch.Tensor))
        builder.close()
    finally:
        first.teardown("fit")
        again.teardown("fit")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_trim_to_layer_from_pyg_works_on_the_batch(kind) -> None:
    dm = kind.datamodule()
    dm.setup("fit")
    try:
        batch = next(iter(dm.train_dataloader()))
    finally:
        dm.teardown("fit")
    by_type, by_edge = nodes(batch), edges(batch)
    xs = {t: s.n_id.float().unsqueeze(1) for t, s in by_type.items()}
    if kind.typed:
        x, edge_index, _ = trim_to_layer(1, batch.num_sampled_nodes_dict, batch.num_sampled_edges_dict, xs,
                                         batch.edge_index_dict)  # fmt: skip
    else:  # one type: PyG's lists and tensors
        out = trim_to_layer(1, batch.num_sampled_nodes, batch.num_sampled_edges, *xs.values(), batch.edge_index)
        x, edge_index = dict(zip(xs, out[:1])), dict(zip(by_edge, out[1:2]))
    for node_type, store in by_type.items():
        assert x[node_type].shape[0] == sum(store.num_sampled_nodes[:-1])
    for et, index in edge_index.items():
        assert index.shape[1] == sum(by_edge[et].num_sampled_edges[:-1])
        if index.numel():
            assert int(index[0].max()) < x[et[0]].shape[0] and int(index[1].max()) < x[et[2]].shape[0]


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_eval_is_node_keyed_and_x_dtype_casts(kind) -> None:
    eval_fanouts = {"eval_num_neighbors": [2, 2]} if kind.typed else {"eval_fanouts": [2, 2]}
    module = kind.datamodule(x_dtype="float16", **eval_fanouts)
    module.setup("fit")
    try:
        assert module.builder("val").node_keyed and not module.builder("train").node_keyed
        batch = next(iter(module.val_dataloader()))
        assert kind.seeds(batch).batch_size == 8
        featured = [s for s in nodes(batch).values() if "x" in s]
        assert len(featured) == (2 if kind.typed else 1) and all(s.x.dtype == torch.float16 for s in featured)
    finally:
        module.teardown("fit")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_predict_all_covers_every_input_node(kind) -> None:
    module = kind.datamodule(predict_split="all", eval_batch_size=16)
    module.setup("predict")
    try:
        seeds = torch.cat([kind.seeds(b).n_id[: kind.seeds(b).batch_size] for b in module.predict_dataloader()])
        assert sorted(seeds.tolist()) == list(range(40))
    finally:
        module.teardown("predict")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_fit_a_few_steps_and_release_everything(tmp_path: Path, kind) -> None:
    module = kind.datamodule()
    model = kind.model(module)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=1, enable_checkpointing=False)
    trainer.fit(model, datamodule=module)
    assert trainer.global_step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert module.resources is None and not _lzc_segments()  # released at teardown


def test_epochs_reshuffle_and_eval_is_stable(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path)
    dm.setup("fit")
    train = dm.train_dataloader()
    first = next(iter(train)).n_id
    train.set_epoch(1)
    assert not torch.equal(next(iter(train)).n_id, first)
    train.set_epoch(0)
    assert torch.equal(next(iter(train)).n_id, first)
    dm.teardown("fit")


def test_bad_recipe_values_name_the_key(tmp_path: Path) -> None:
    dataset = SyntheticGraph(num_nodes=100, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="batch_size"):
        ZeroCopyDataModule(dataset, batch_size=0)
    with pytest.raises(ValueError, match=r"fanouts\[1\]"):
        ZeroCopyDataModule(dataset, fanouts=[5, 0])
    with pytest.raises(ValueError, match="feature_storage"):
        ZeroCopyDataModule(dataset, feature_storage="gpu")  # type: ignore[arg-type]


def test_mmap_feature_storage_reads_the_cached_file(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path, feature_storage="mmap")
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    x = dm.dataset.load().x
    assert torch.equal(batch.x, x[batch.n_id])
    dm.teardown("fit")


def test_host_memory_consumers_attach_before_the_names_are_unlinked(tmp_path: Path) -> None:
    import pickle

    from lightning_zerocopy.data import HostMemoryConsumer

    class OpensACopy(Callback):
        """Stands in for a pipeline callback whose worker opens the builder by name."""

        def __init__(self) -> None:
            self.batch = None

        def attach_host_memory(self, trainer, datamodule) -> None:
            assert datamodule.handles.features.data.exists(), "segments must still be named here"
            worker_builder = pickle.loads(pickle.dumps(datamodule.builder("train"))).open()
            self.batch = worker_builder.build_batch(datamodule.plan("train").item(0, 0))

    consumer = OpensACopy()
    assert isinstance(consumer, HostMemoryConsumer)
    dm = _datamodule(tmp_path)
    trainer = _trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[consumer])
    trainer.fit(PyGStyleSAGE(dm.num_features, dm.num_classes), datamodule=dm)
    assert consumer.batch is not None and consumer.batch.batch_size == 128
    assert not _lzc_segments()


def test_resume_from_an_epoch_end_checkpoint_starts_the_next_epoch(tmp_path: Path) -> None:
    pl.seed_everything(0)
    dm = _datamodule(tmp_path, batch_size=100)
    record = RecordBatches()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}-{step}", every_n_epochs=1)
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[record, ckpt], limit_val_batches=0)
    trainer.fit(PyGStyleSAGE(dm.num_features, dm.num_classes), datamodule=dm)
    steps_per_epoch = trainer.num_training_batches

    resumed = RecordBatches()
    trainer2 = _trainer(tmp_path, max_epochs=3, callbacks=[resumed], limit_val_batches=0)
    path = tmp_path / "ckpt" / f"epoch=0-step={steps_per_epoch}.ckpt"
    trainer2.fit(PyGStyleSAGE(dm.num_features, dm.num_classes), datamodule=_datamodule(tmp_path, batch_size=100), ckpt_path=path)
    assert sorted(resumed.seen) == [key for key in sorted(record.seen) if key[0] >= 1]
    for key, (n_id, _) in resumed.seen.items():
        assert torch.equal(n_id, record.seen[key][0]), key


# ---- splits are checked once at setup, before any batch ------------------------------------------------------


def _pyg_datamodule(train: list[int], val: list[int], test: list[int]) -> ZeroCopyDataModule:
    from lightning_zerocopy.datasets import PyGNodeDataset

    gen = torch.Generator().manual_seed(0)
    n = 40
    data = Data(
        x=torch.randn(n, 4, generator=gen),
        y=torch.randint(0, 3, (n,), generator=gen),
        edge_index=torch.randint(0, n, (2, 120), generator=gen),
        train_idx=torch.tensor(train),
        val_idx=torch.tensor(val),
        test_mask=torch.isin(torch.arange(n), torch.tensor(test)),
    )
    return ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[3], batch_size=4)


def test_setup_rejects_a_split_that_repeats_a_node() -> None:
    dm = _pyg_datamodule(list(range(30)) + [12], [30, 31], [32, 33])
    with pytest.raises(ValueError, match=r"^data\.init_args\.dataset \(PyGNodeDataset\): the train split \(data\.train_idx\) "
                                          r"lists node 12 more than once \(entries 13 and 31"):
        dm.setup("fit")
    assert dm._handles is None and not _lzc_segments()


def test_setup_rejects_a_split_id_out_of_range() -> None:
    dm = _pyg_datamodule(list(range(30)), [30, 40], [32])
    with pytest.raises(ValueError, match=r"^data\.init_args\.dataset \(PyGNodeDataset\): the val split \(data\.val_idx\) holds "
                                          r"node id 40 at entry 2 .* the graph has 40 nodes"):
        dm.setup("fit")


def test_setup_warns_once_about_splits_that_share_nodes() -> None:
    dm = _pyg_datamodule(list(range(30)), [30, 31], [31, 32])
    with pytest.warns(UserWarning, match=r"data\.init_args\.dataset \(PyGNodeDataset\): the val split \(data\.val_idx\) and "
                                         r"the test split \(data\.test_mask\) share 1 node \(e\.g\. 31\)"):
        dm.setup("fit")
    dm.teardown("fit")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second setup (fit, then test) does not warn again
        dm.setup("test")
    dm.teardown("test")


def test_setup_names_an_edge_to_no_node_of_any_dataset() -> None:
    """A dataset that does not check its edges itself: the graph's build refused the id naming no dataset field."""
    from helpers import random_node_data

    from lightning_zerocopy.datasets.base import InputDataError, NodeDataset

    class Edges(NodeDataset):
        num_features, num_classes = 8, 5

        def load(self):
            data = random_node_data(50, 200, 8, seed=0, train=30, val=10)
            data.edge_index[1, 77] = 50
            return data

    dm = ZeroCopyDataModule(Edges(), fanouts=[3], batch_size=4)
    with pytest.raises(InputDataError, match=r"^data\.init_args\.dataset \(Edges\): edge_index holds node id 50 at "
                                             r"edge_index\[1, 77\] \(a destination\), but the features have 50 rows"):
        dm.setup("fit")
    assert dm._handles is None and not _lzc_segments()


def test_setup_refuses_training_nodes_in_the_test_split_unless_allowed(tmp_path: Path) -> None:
    """Overlapping train and test masks gave a warning, then training went on: label leakage."""
    dm = _pyg_datamodule(list(range(30)), [30, 31], [5, 32, 7, 33])
    with pytest.raises(ValueError, match=r"^data\.init_args\.dataset \(PyGNodeDataset\): the test split \(data\.test_mask\) "
                                          r"shares 2 nodes with the train split \(data\.train_idx\), the first being node 5: .* "
                                          r"set data\.init_args\.allow_split_overlap: true to train anyway$"):
        dm.setup("fit")
    assert dm._handles is None and not _lzc_segments()
    allowed = ZeroCopyDataModule(dm.dataset, fanouts=[3], batch_size=4, allow_split_overlap=True)
    with pytest.warns(UserWarning, match=r"the train split \(data\.train_idx\) and the test split \(data\.test_mask\) "
                                         r"share 2 nodes"):
        _trainer(tmp_path, max_epochs=1).fit(PyGStyleSAGE(4, 3), datamodule=allowed)


def test_setup_rejects_a_nan_feature_naming_node_and_column_unless_told_not_to_check() -> None:
    dm = _pyg_datamodule(list(range(30)), [30, 31], [32, 33])
    dm.dataset.data.x[17, 2] = float("nan")  # the loss would be NaN from the first step that samples node 17
    with pytest.raises(ValueError, match=r"^data\.init_args\.dataset \(PyGNodeDataset\) features: nan at node 17, column 2 "
                                          r".* set data\.init_args\.check_features: false to train"):
        dm.setup("fit")
    assert dm._handles is None and not _lzc_segments()
    unchecked = ZeroCopyDataModule(dm.dataset, fanouts=[3], batch_size=4, check_features=False)
    unchecked.setup("fit")
    unchecked.teardown("fit")


def test_setup_rejects_a_label_below_minus_one_naming_the_node() -> None:
    dm = _pyg_datamodule(list(range(30)), [30, 31], [32, 33])
    dm.dataset.data.y[12] = -3  # failed inside the training step with torch's "Target -3 is out of bounds"
    with pytest.raises(ValueError, match=r"the train split \(data\.train_idx\) holds node 12 labeled -3"):
        dm.setup("fit")


@pytest.mark.parametrize("train, drop_last, message", [
    ([], False, r"the train split \(data\.train_idx\) holds no node: there is nothing to fit"),
    ([0, 1, 2], True, r"the train split \(data\.train_idx\) holds 3 nodes, which fill no whole batch of "
                      r"data\.init_args\.batch_size over 1 rank with data\.init_args\.drop_last=true"),
])  # fmt: skip
def test_fit_with_nothing_to_train_is_an_error(tmp_path: Path, train: list[int], drop_last: bool, message: str) -> None:
    """Lightning alone warns "No training batches" and fit returns as if it had trained."""
    dm = _pyg_datamodule(train, [30, 31], [32, 33])
    dm.drop_last = drop_last
    model = PyGStyleSAGE(4, 3)
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    assert not _lzc_segments()
