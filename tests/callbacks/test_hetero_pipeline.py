"""PipelineCallback with ZeroCopyHeteroDataModule on the CPU: the producer (a thread or a worker process) builds the
same HeteroData batches as the DataModule's own loader, through flattened slots (pipeline/hetero_slots.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from torch_geometric.data import HeteroData

from helpers.hetero import EDGE_TYPES, PAPER, TinyHeteroDataset, TinyHeteroSAGE
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.pipeline.hetero_slots import HETERO_TYPES, flatten_hetero, unflatten_hetero
from lightning_zerocopy.pipeline.slots import SlotLayout, view_batch


def _datamodule() -> ZeroCopyHeteroDataModule:
    return ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=6, eval_batch_size=4,
                                    num_threads=1)  # fmt: skip


def _fields(batch: HeteroData) -> dict:
    """Every store's fields, keyed by (type, field): tensors cloned (slot views are reused)."""
    out = {}
    for store in (*batch.node_stores, *batch.edge_stores):
        for field, value in store.items():
            out[(store._key, field)] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


class _Record(Callback):
    def __init__(self) -> None:
        self.train: dict[tuple[int, int], dict] = {}
        self.val: dict[int, dict] = {}
        self.loader = ""

    def on_train_start(self, trainer, pl_module) -> None:
        self.loader = type(trainer.train_dataloader).__name__

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        assert isinstance(batch, HeteroData)
        self.train[(trainer.current_epoch, batch_idx)] = _fields(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.val[batch_idx] = _fields(batch)


def _fit(tmp_path: Path, *callbacks: Callback) -> tuple[_Record, TinyHeteroSAGE]:
    pl.seed_everything(0)
    dm = _datamodule()
    model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
    record = _Record()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[*callbacks, record])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return record, model


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and len(want) > 0
    for key, fields in want.items():
        assert got[key].keys() == fields.keys(), key
        for name, value in fields.items():
            other = got[key][name]
            if isinstance(value, torch.Tensor):
                assert other.dtype == value.dtype and torch.equal(other, value), (key, name)
            else:
                assert other == value, (key, name)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize("mode", ["in_process", "worker"])
def test_the_pipeline_builds_the_same_batches_and_trains_the_same(tmp_path: Path, baseline, mode: str) -> None:
    telemetry = DataTelemetry(prog_bar=False)
    record, model = _fit(tmp_path, PipelineCallback(mode=mode), telemetry)
    want, want_model = baseline
    assert record.loader == "PipelineLoader" and want.loader == "PlanLoader"
    steps = telemetry.history  # the slot views' sizes, counted per type; the producer's build time beside them
    assert len(steps) == 2 * 4 - 2 and all(s["data/build_ms"] > 0 and s["data/seps"] > 0 for s in steps)
    counted = [f for (epoch, step), f in sorted(record.train.items()) if step > 0]  # an epoch's first has no interval
    assert [s["data/rows_author"] for s in steps] == [float(f[("author", "n_id")].numel()) for f in counted]
    _assert_same(record.train, want.train)
    _assert_same(record.val, want.val)
    assert set(k[0] for k in record.train) == {0, 1} and any(("author", "x") not in f for f in record.train.values())
    for a, b in zip(model.parameters(), want_model.parameters()):
        assert torch.equal(a, b)


def test_predictions_through_the_pipeline_equal_those_without(tmp_path: Path) -> None:
    files = []
    for callbacks in ([], [PipelineCallback(mode="in_process")]):
        out = tmp_path / str(len(callbacks))
        dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=6, eval_batch_size=3,
                                      num_threads=1, predict_split="all")  # fmt: skip
        torch.manual_seed(0)
        model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes).eval()
        pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   callbacks=[*callbacks, PredictionWriter(str(out))]).predict(model, datamodule=dm,
                                                                               return_predictions=False)  # fmt: skip
        files.append(dict(np.load(out / "predictions.npz")))
    assert files[0]["node_id"].tolist() == list(range(40)) and str(files[1]["node_type"]) == PAPER
    for key in ("node_id", "logits", "pred", "prob"):
        assert np.array_equal(files[0][key], files[1][key]), key


def test_a_flattened_batch_round_trips_through_a_slot_layout() -> None:
    dm = _datamodule()
    dm.setup("fit")
    try:
        loader = iter(dm.train_dataloader())
        first, second = next(loader), next(loader)
    finally:
        dm.teardown("fit")
    flat = flatten_hetero(first)
    layout = SlotLayout.from_batch(flat)
    by_name = {f.name: f for f in layout.fields}
    assert all(f.axis == f.name for f in layout.fields)  # one axis per field: types never share a length
    assert by_name["e1/edge_index"].var_dim == 1 and by_name["n0/x"].var_dim == 0
    assert layout.scalars(flat)[HETERO_TYPES] == (("paper", "author", "institution"), tuple(EDGE_TYPES))
    # a slot sized for the larger of two batches holds either; its views rebuild the batch
    flat2 = flatten_hetero(second)
    capacity = {a: max(layout.sizes(flat)[a], layout.sizes(flat2)[a]) for a in layout.axes}
    buffers = {f.name: torch.zeros(f.alloc_shape(capacity[f.axis]), dtype=f.dtype) for f in layout.fields}
    from lightning_zerocopy.pipeline.slots import write_batch

    sizes = layout.sizes(flat2)
    write_batch(layout, buffers, flat2, sizes)
    rebuilt = unflatten_hetero(view_batch(layout, buffers, sizes, layout.scalars(flat2)))
    assert isinstance(rebuilt, HeteroData) and rebuilt.node_types == second.node_types
    _assert_same({0: _fields(rebuilt)}, {0: _fields(second)})


def test_other_host_memory_consumers_are_still_refused(tmp_path: Path) -> None:
    class _Consumer(Callback):
        def attach_host_memory(self, trainer, datamodule) -> None:  # a host-memory consumer that is not the pipeline
            pass

    dm = _datamodule()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, callbacks=[_Consumer()],
                         default_root_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ValueError, match="_Consumer is not yet supported with ZeroCopyHeteroDataModule.*remove it "
                                         "from trainer.callbacks"):  # fmt: skip
        trainer.fit(TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes), datamodule=dm)

    class _CachingStrategy:  # stands in for ZeroCopyDDPStrategy (a host-memory consumer as a strategy)
        def attach_host_memory(self, trainer, datamodule) -> None:
            pass

    from types import SimpleNamespace

    dm.trainer = SimpleNamespace(strategy=_CachingStrategy(), callbacks=[PipelineCallback(mode="in_process")])
    with pytest.raises(ValueError, match="_CachingStrategy is not yet supported.*set trainer.strategy to ddp"):
        dm.setup("fit")


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["in_process", "worker"])
@pytest.mark.parametrize("placement, gather", [("cpu", "cpu"), ("uva", "zerocopy"), ("gpu", "cpu")])
def test_on_a_gpu_the_pipeline_yields_the_loaders_batches(tmp_path: Path, mode: str, placement: str,
                                                         gather: str) -> None:  # fmt: skip
    """Batches built on the GPU (or on the CPU into CUDA slots) cross the slots flattened and equal the DataModule's
    own loader's, field by field."""
    records = []
    for callbacks in ([], [PipelineCallback(mode=mode)]):
        pl.seed_everything(0)
        dm = ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=6, num_threads=1,
                                      sampler_placement=placement, gather=gather)  # fmt: skip
        model = TinyHeteroSAGE(dm.metadata, dm.num_features, dm.num_nodes, dm.num_classes)
        record = _Record()
        pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, limit_val_batches=2, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   default_root_dir=str(tmp_path), callbacks=[*callbacks, record]).fit(model, datamodule=dm)  # fmt: skip
        records.append(record)
    plain, piped = records
    assert piped.loader == "PipelineLoader"
    _assert_same(piped.train, plain.train)
    _assert_same(piped.val, plain.val)
