"""Heterogeneous link batches built on a GPU (CUDA sampler over uva/gpu topologies, zero-copy gathers) equal the
CPU builder's, field by field and store by store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.hetero_link import small_graph

from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.data.batch import HeteroBatchBuilder


def _fields(batch) -> dict:
    out = {}
    for store in (*batch.node_stores, *batch.edge_stores):
        for field, value in store.items():
            out[(store._key, field)] = value.cpu() if isinstance(value, torch.Tensor) else value
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("neg_sampling", ["binary", {"mode": "triplet", "amount": 2}])
@pytest.mark.parametrize(("placement", "gather"), [("cpu", "zerocopy"), ("uva", "zerocopy"), ("gpu", "cpu")])
def test_gpu_link_batches_equal_the_cpu_builders(tmp_path: Path, neg_sampling, placement: str, gather: str) -> None:
    dm = ZeroCopyHeteroLinkDataModule(small_graph(str(tmp_path)), num_neighbors=[3, 2], batch_size=48,
                                      eval_batch_size=16, neg_sampling=neg_sampling, num_threads=1)  # fmt: skip
    dm.setup("fit")
    try:
        for split in ("train", "val"):
            cpu = dm.builder(split).open(dm.resources)  # no trainer: the CPU builder
            gpu = HeteroBatchBuilder(
                dm.handles, cpu.fanouts, num_threads=1, sampler_placement=placement,  # type: ignore[arg-type]
                gather=gather, device=0, node_keyed=cpu.node_keyed,  # type: ignore[arg-type]
            ).open(dm.resources)
            plan = dm.plan(split)
            for step in range(min(3, len(plan))):
                item = plan.item(0, step)
                want, got = _fields(cpu.build_batch(item)), _fields(gpu.build_batch(item))
                assert want.keys() == got.keys()
                for key, value in want.items():
                    same = torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value
                    assert same, (split, step, key)
            gpu.close()
            cpu.close()
    finally:
        dm.teardown("fit")
