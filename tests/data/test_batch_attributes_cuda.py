"""The user's attributes in batches built on a GPU: every sampler placement (``gpu``, ``uva``, ``hybrid``) and gather
(``cpu``: the CPU gathers GPU-sampled ids; ``zerocopy``: small tables copied to the GPU, large ones read from host
memory by the zero-copy kernel) gives bitwise the CPU builder's attributes, which are PyG's ``filter_data`` rows; the
same through a pipeline worker on a GPU trainer."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from helpers.attributes import attributed_datamodule, attributes_of_batch, pyg_reference

from lightning_zerocopy.data import attributes as device_attributes
from lightning_zerocopy.data.batch import BatchBuilder

pytestmark = pytest.mark.cuda


def _cpu(batch: Any) -> dict:
    return {key: value.cpu() for key, value in attributes_of_batch(batch).items()}


@pytest.mark.parametrize("kind", ["node", "link", "hetero", "hetero_link"])
@pytest.mark.parametrize(("placement", "gather"), [("gpu", "cpu"), ("uva", "zerocopy"), ("cpu", "zerocopy"),
                                                   ("gpu", "zerocopy"), ("hybrid", "zerocopy")])  # fmt: skip
@pytest.mark.parametrize("small_bytes", [device_attributes.SMALL_ATTRIBUTE_BYTES, 0], ids=["gpu_copy", "zerocopy"])
def test_gpu_batches_carry_the_cpu_builders_attributes(kind: str, placement: str, gather: str, small_bytes: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(device_attributes, "SMALL_ATTRIBUTE_BYTES", small_bytes)  # 0: every table read zero-copy
    dm, source = attributed_datamodule(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("fit")
    try:
        for split in ("train", "val"):
            cpu = dm.builder(split).open(dm.resources)  # no trainer: the CPU builder
            gpu = BatchBuilder(dm.handles, cpu.fanouts, num_threads=1, sampler_placement=placement,  # type: ignore[arg-type]
                               gather=gather, device=0, node_keyed=cpu.node_keyed).open(dm.resources)  # type: ignore[arg-type]
            plan = dm.plan(split)
            for step in range(min(3, len(plan))):
                item = plan.item(0, step)
                want, built = cpu.build_batch(item), gpu.build_batch(item)
                got = attributes_of_batch(built)
                assert all(value.is_cuda for value in got.values())
                assert _cpu(built).keys() == _cpu(want).keys()
                for key, value in _cpu(want).items():
                    other = got[key].cpu()
                    assert other.dtype == value.dtype and torch.equal(other, value), (split, step, key)
                reference = pyg_reference(source, built.cpu())
                assert all(torch.equal(got[key].cpu(), value) for key, value in reference.items())
            gpu.close()
            cpu.close()
    finally:
        dm.teardown("fit")


def test_an_untyped_attribute_is_written_into_its_out_buffer_on_the_gpu() -> None:
    dm, data = attributed_datamodule("node")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("fit")
    try:
        builder = BatchBuilder(dm.handles, [3, 2], num_threads=1, gather="zerocopy", device=0).open(dm.resources)
        buffer = torch.empty(4096, dtype=torch.float32, device="cuda")
        batch = builder.build_batch(dm.plan("train").item(0, 0), out={"edge_weight": buffer})
        assert batch.edge_weight.data_ptr() == buffer.data_ptr()
        assert torch.equal(batch.edge_weight.cpu(), data.edge_weight[batch.e_id.cpu()])
        builder.close()
    finally:
        dm.teardown("fit")


def test_node_attributes_under_a_node_order_on_the_gpu() -> None:
    dm, data = attributed_datamodule("node", node_order="bfs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("fit")
    try:
        builder = BatchBuilder(dm.handles, [3, 2], num_threads=1, sampler_placement="gpu", gather="zerocopy",
                               device=0).open(dm.resources)  # fmt: skip
        for step in range(2):
            batch = builder.build_batch(dm.plan("train").item(0, step)).cpu()
            reference = pyg_reference(data, batch)
            assert reference and all(torch.equal(batch[k[1]], v) for k, v in reference.items())
        builder.close()
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_a_pipeline_on_a_gpu_trainer_yields_the_attributes(tmp_path: Path, mode: str) -> None:
    """The weighted GCN on GPU batches (``gpu`` sampler, zero-copy gather) built by a pipeline worker: every batch's
    attributes are PyG's rows of the source graph."""
    from helpers.attributes import WeightedGCN, attributed_data

    from lightning_zerocopy import ZeroCopyDataModule
    from lightning_zerocopy.callbacks import PipelineCallback
    from lightning_zerocopy.datasets import PyGNodeDataset

    data = attributed_data(num_nodes=300, num_edges=2400)
    dm = ZeroCopyDataModule(PyGNodeDataset(data), fanouts=[4, 3], batch_size=32, num_threads=1,
                            sampler_placement="gpu", gather="zerocopy")  # fmt: skip
    seen: list[dict] = []

    class _Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            # a copy: PyG's Data.cpu() moves the batch itself, and the training step would get CPU tensors
            seen.append({"batch": batch.clone().cpu(), "attributes": _cpu(batch)})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, limit_train_batches=4, limit_val_batches=1,
                   logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                   callbacks=[PipelineCallback(mode=mode), _Record()]).fit(WeightedGCN(6, 3), datamodule=dm)  # fmt: skip
    assert len(seen) == 4
    for entry in seen:
        reference = pyg_reference(data, entry["batch"])
        assert reference.keys() == entry["attributes"].keys()
        assert all(torch.equal(entry["attributes"][key], value) for key, value in reference.items())
