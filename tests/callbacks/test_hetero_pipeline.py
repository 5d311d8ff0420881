"""What only the typed graph has through PipelineCallback: a HeteroData batch flattened into a slot layout and rebuilt,
the host-memory consumers still refused, the GPU batches through flattened slots (the same batches, training and
predictions on both graph kinds: test_pipeline_callback.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from torch_geometric.data import HeteroData

from helpers.hetero import EDGE_TYPES, TinyHeteroDataset, TinyHeteroSAGE
from helpers.kinds import assert_same_fields, fields
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.callbacks import PipelineCallback
from lightning_zerocopy.pipeline.slots import HETERO_TYPES, flatten_hetero, unflatten_hetero
from lightning_zerocopy.pipeline.slots import SlotLayout, view_batch


def _datamodule() -> ZeroCopyHeteroDataModule:
    return ZeroCopyHeteroDataModule(TinyHeteroDataset(), num_neighbors=[3, 2], batch_size=6, eval_batch_size=4,
                                    num_threads=1)  # fmt: skip


class _Record(Callback):
    def __init__(self) -> None:
        self.train: dict[tuple[int, int], dict] = {}
        self.val: dict[int, dict] = {}
        self.loader = ""

    def on_train_start(self, trainer, pl_module) -> None:
        self.loader = type(trainer.train_dataloader).__name__

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        assert isinstance(batch, HeteroData)
        self.train[(trainer.current_epoch, batch_idx)] = fields(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.val[batch_idx] = fields(batch)


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and len(want) > 0
    for key, batch in want.items():
        assert_same_fields(got[key], batch, key)


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
    buffers = {f.name: f.buffer(capacity[f.axis], torch.device("cpu")).zero_() for f in layout.fields}
    from lightning_zerocopy.pipeline.slots import write_batch

    sizes = layout.sizes(flat2)
    write_batch(layout, buffers, flat2, sizes)
    rebuilt = unflatten_hetero(view_batch(layout, buffers, sizes, layout.scalars(flat2)))
    assert isinstance(rebuilt, HeteroData) and rebuilt.node_types == second.node_types
    assert_same_fields(fields(rebuilt), fields(second))


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
