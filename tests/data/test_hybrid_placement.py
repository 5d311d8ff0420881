"""``sampler_placement: hybrid | auto``: batches identical to the CPU sampler's wherever a batch is sampled, the
size estimate in the dataset's ids, one line (and CPU sampling) without a GPU, errors naming the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from test_gpu_data_path import SAGE, _assert_same_batch, _datamodule, _graph, _item, _trainer, shared  # noqa: F401 (fixture)

import lightning_zerocopy.data.hybrid_lanes as hybrid_lanes_module
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.host.share import share_node_data

NO_CUDA = not torch.cuda.is_available()


@pytest.fixture
def bfs_shared(tmp_path: Path):
    data = _graph()
    handles = share_node_data(data, node_order="bfs", cache_dir=tmp_path / "order")
    yield data, handles
    handles.unlink()


@pytest.mark.skipif(not NO_CUDA, reason="checks a machine without a CUDA GPU")
@pytest.mark.parametrize("placement", ["hybrid", "auto"])
def test_hybrid_without_a_gpu_says_so_and_builds_the_cpu_batches(shared, placement) -> None:
    data, handles = shared
    with pytest.warns(UserWarning, match=f"sampler_placement='{placement}': no CUDA GPU is visible, so sampling runs on the CPU only"):
        builder = BatchBuilder(handles, [5, 3], sampler_placement=placement)
    assert not builder.on_gpu and builder.hybrid_lanes is None and builder.hybrid_policy() is None
    reference = BatchBuilder(handles, [5, 3])
    for step in range(3):
        got, want = builder.build_batch(_item(data, step)), reference.build_batch(_item(data, step))
        for key in ("x", "y", "n_id", "e_id", "edge_index", "input_id"):
            assert torch.equal(got[key], want[key]), key
    with pytest.raises(RuntimeError, match="expected_size\\(\\) is for hybrid builders"):
        builder.expected_size(_item(data))


def test_a_lane_the_builder_does_not_have_is_rejected(shared) -> None:
    data, handles = shared
    with pytest.raises(ValueError, match="`lane` must be one of this builder's sampling devices"):
        BatchBuilder(handles, [5, 3]).sample_batch(_item(data), lane="gpu")


def test_builder_rejects_an_unknown_placement_listing_the_values(shared) -> None:
    _, handles = shared
    with pytest.raises(ValueError, match="`sampler_placement` must be 'cpu', 'uva', 'gpu', 'hybrid' or 'auto', got 'both'"):
        BatchBuilder(handles, [5, 3], sampler_placement="both")


def test_datamodule_rejects_an_unknown_placement_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.init_args\.sampler_placement must be .*'hybrid' or 'auto', got 'fastest'"):
        _datamodule(tmp_path, sampler_placement="fastest")


def test_expected_size_sums_over_the_seeds_in_the_datasets_ids(bfs_shared, monkeypatch) -> None:
    # as on a GPU machine (the estimate itself needs no GPU); with all neighbors taken on one hop the expected
    # size is exact: the batch's edges plus one per seed. A seed not mapped to the internal order would miss.
    monkeypatch.setattr(hybrid_lanes_module, "cuda_usable", lambda: (True, ""))
    data, handles = bfs_shared
    hybrid = BatchBuilder(handles, [-1], sampler_placement="hybrid")
    assert hybrid.hybrid_lanes == ("cpu", "gpu") and hybrid.hybrid_policy().lanes == ["cpu", "gpu"]
    reference = BatchBuilder(handles, [-1])
    for step in range(4):
        item = _item(data, step)
        batch = reference.build_batch(item)
        assert hybrid.expected_size(item) == pytest.approx(batch.edge_index.shape[1] + item.batch_size)


@pytest.mark.skipif(not NO_CUDA, reason="checks a CPU trainer on a machine without a GPU")
@pytest.mark.parametrize("placement", ["hybrid", "auto"])
def test_datamodule_hybrid_on_a_cpu_trainer_says_so_in_one_line(tmp_path: Path, caplog, placement) -> None:
    dm = _datamodule(tmp_path, sampler_placement=placement)
    seen = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(batch.x.device.type)

    with caplog.at_level(logging.INFO):
        trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=0, callbacks=[Record()])
        trainer.fit(SAGE(dm.num_features, dm.num_classes), datamodule=dm)
    lines = [r.getMessage() for r in caplog.records if "sampling runs on the CPU only" in r.getMessage()]
    assert lines == [f"data.init_args.sampler_placement={placement!r}: the trainer runs on 'cpu', so sampling runs on the CPU only"]
    assert seen == ["cpu", "cpu"] and dm._gpu.placement == "cpu"


# --------------------------------------------------------------------------------------------- CUDA tests


@pytest.mark.cuda
@pytest.mark.parametrize("gather", ["cpu", "zerocopy"])
def test_hybrid_batches_are_bitwise_the_cpu_batches_on_either_device(gather) -> None:
    data = _graph()
    handles = share_node_data(data)
    device = torch.device("cuda", torch.cuda.current_device())
    hybrid = BatchBuilder(handles, [6, 4], sampler_placement="hybrid", gather=gather)
    reference = BatchBuilder(handles, [6, 4])
    try:
        assert hybrid.hybrid_lanes == ("cpu", "gpu") and hybrid.on_gpu
        for step in range(12):
            item = _item(data, step)
            want = reference.build_batch(item)
            for lane in ("cpu", "gpu", None):  # None: the builder's own cost model places it
                got = hybrid.gather_batch(hybrid.sample_batch(item, lane=lane))
                _assert_same_batch(got, want, data, device, torch.float32)  # the builders cast x to float32
        stats = hybrid.sampling_stats
        assert stats is not None and sum(s.batches for s in stats.lanes.values()) == 12
        assert all(stats.lanes[lane].batches >= 1 for lane in ("cpu", "gpu"))  # both calibrated
    finally:
        hybrid.close()
        reference.close()
        handles.unlink()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["in_process", "worker"])
def test_hybrid_fit_with_the_pipeline_trains_on_the_cpu_runs_batches(tmp_path: Path, mode) -> None:
    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

    def run(placement: str, callbacks: list) -> list[tuple[torch.Tensor, ...]]:
        pl.seed_everything(0)
        dm = _datamodule(tmp_path, sampler_placement=placement, gather="zerocopy")
        seen: list[tuple[torch.Tensor, ...]] = []

        class Record(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                seen.append(tuple(batch[k].cpu().clone() for k in ("n_id", "edge_index", "e_id", "x", "y")))

        trainer = _trainer(tmp_path, accelerator="gpu", max_epochs=2, limit_val_batches=2, callbacks=[Record(), *callbacks])
        trainer.fit(SAGE(dm.num_features, dm.num_classes), datamodule=dm)
        return seen

    telemetry = DataTelemetry(prog_bar=False)
    hybrid = run("hybrid", [PipelineCallback(mode=mode, depth=2), telemetry])
    cpu = run("cpu", [])
    assert len(hybrid) == len(cpu) > 0
    for got, want in zip(hybrid, cpu):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    shares = [m for m in telemetry.history if "data/share_gpu" in m]
    assert shares and shares[-1]["data/share_gpu"] + shares[-1]["data/share_cpu"] == pytest.approx(1.0)
    assert all(m["data/sample_ms"] > 0 and m["data/sample_pred_ms"] > 0 for m in shares)
