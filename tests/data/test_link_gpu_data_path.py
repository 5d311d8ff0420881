"""The link data path on the GPU: every (sampler_placement, gather) builds bitwise the CPU placement's link batch,
and a Lightning fit on the GPU through the pipeline learns. CUDA only (``@pytest.mark.cuda``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.link import PyGLinkModule, TinyLinkGraph, auroc

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.data.batch import BatchBuilder

COMBOS = [("cpu", "zerocopy"), ("uva", "cpu"), ("uva", "zerocopy"), ("gpu", "cpu"), ("gpu", "zerocopy"), ("hybrid", "zerocopy")]
FIELDS = ("n_id", "e_id", "edge_index", "input_id", "edge_label_index", "edge_label", "edge_label_query",
          "src_index", "dst_pos_index", "dst_neg_index")  # fmt: skip


def _same(gpu, ref, x: torch.Tensor, device: torch.device) -> None:
    for key in FIELDS:
        if key not in ref:
            assert key not in gpu, key
            continue
        assert gpu[key].device == device, key
        assert gpu[key].dtype == ref[key].dtype and torch.equal(gpu[key].cpu(), ref[key]), key
    for key in ("batch_size", "num_sampled_nodes", "num_sampled_edges"):
        assert gpu[key] == ref[key], key
    assert torch.equal(gpu.x.cpu(), x[gpu.n_id.cpu()])


@pytest.mark.cuda
@pytest.mark.parametrize("placement, gather", COMBOS)
@pytest.mark.parametrize("neg_sampling", ["binary", {"mode": "triplet", "amount": 3}, {"mode": "binary", "amount": 2, "dst_weight": "degree"}])
@pytest.mark.parametrize("node_order", ["none", "bfs"])
def test_gpu_link_batch_equals_the_cpu_link_batch(placement, gather, neg_sampling, node_order) -> None:
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(num_nodes=2000, num_edges=20000), num_neighbors=[6, 4], batch_size=128,
                                neg_sampling=neg_sampling, node_order=node_order, seed=4)  # fmt: skip
    dm.setup("fit")
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        x = dm.dataset.load().x
        ref = BatchBuilder(dm.handles, dm.fanouts).open(dm.resources)
        gpu = BatchBuilder(dm.handles, dm.fanouts, sampler_placement=placement, gather=gather).open(dm.resources)
        for split in ("train", "val"):
            plan = dm.plan(split)
            for step in range(min(3, len(plan))):
                item = plan.item(1, step)
                _same(gpu.build_batch(item), ref.build_batch(item), x, device)
        gpu.close()
        ref.close()
    finally:
        dm.teardown("fit")


@pytest.mark.cuda
@pytest.mark.parametrize("pipeline", [None, "worker"])
def test_gpu_fit_with_the_zero_copy_gather_learns(tmp_path: Path, pipeline) -> None:
    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

    torch.manual_seed(0)
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(), num_neighbors=[5, 5], batch_size=64, sampler_placement="gpu",
                                gather="zerocopy", hot_rows=50)  # fmt: skip
    model = PyGLinkModule(dm.num_features)
    callbacks = [DataTelemetry()] + ([PipelineCallback(mode=pipeline)] if pipeline else [])
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=4, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, callbacks=callbacks,
                         default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(model, datamodule=dm)
    val_steps = -(-dm.dataset.load().split("val").num_positives // 64)
    scores, labels = (torch.cat(t) for t in zip(*model.val_scores[-val_steps:]))
    assert auroc(scores, labels) > 0.9
