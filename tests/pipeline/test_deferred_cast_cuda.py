"""With ``LIGHTNING_ZEROCOPY_CAST_X_IN_TRAINER=1`` a GPU builder's ``x`` leaves the producer in the host table's dtype
and the trainer's view casts it (``@pytest.mark.cuda``): the batches equal the builder's own, bit for bit, and the
slot holds half the bytes; by default the producer casts."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.source import CAST_X_IN_TRAINER_ENV, PlanSource

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize(
    "mode, dtype, in_worker", [("worker", "bfloat16", False), ("in_process", "float16", False),
                               ("in_process", "bfloat16", True), ("worker", "bfloat16", True)],
)  # fmt: skip
def test_the_trainers_view_casts_x_and_the_batches_are_the_builders(tmp_path, monkeypatch, mode, dtype, in_worker):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if in_worker:
        monkeypatch.delenv(CAST_X_IN_TRAINER_ENV, raising=False)
    else:
        monkeypatch.setenv(CAST_X_IN_TRAINER_ENV, "1")
    dataset = SyntheticGraph(num_nodes=20000, avg_degree=10, num_features=64, num_classes=4, cache_dir=str(tmp_path))
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=256, sampler_placement="gpu", gather="zerocopy",
                            feature_dtype=dtype)  # fmt: skip
    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # names stay until the producer opened them
    dm.setup("fit")
    reference, plan = dm.builder("train"), dm.plan("train")
    client = start_pipeline(mode, depth=2, device="cuda:0", timeout=120)
    try:
        client.register("train", PlanSource(plan, dm.builder("train")))
        for step, batch in enumerate(client.iterate("train", 0, 0, 6)):
            expected = reference.build_batch(plan.item(0, step))
            assert batch.x.dtype == torch.float32
            assert torch.equal(batch.x, expected.x) and torch.equal(batch.n_id, expected.n_id)
            assert torch.equal(batch.edge_index, expected.edge_index) and torch.equal(batch.y, expected.y)
        (x_field,) = [f for f in client._stages["train"].ring.layout.fields if f.name == "x"]
        stored = torch.float32 if in_worker else getattr(torch, dtype)
        assert x_field.dtype == stored
        assert x_field.view_dtype == (None if in_worker else torch.float32)
    finally:
        client.close()
        reference.close()
        unlink(dm.handles)
        dm.teardown("fit")
