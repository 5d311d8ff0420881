"""``sampler_placement: hybrid | auto``, untyped and typed: batches identical to the CPU sampler's wherever a batch is
sampled, the size estimate over every seeded type in the dataset's ids, one line (and CPU sampling) without a GPU,
errors naming the key.

On a CPU machine the ``gpu`` lane is stood in for by the CPU sampler (``_stand_in_lanes``), so the dispatch, the
per-lane statistics and the pipeline producer's hybrid path run here with real builders; the CUDA tests run the real
GPU lane.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.kinds import LINK_KINDS, NODE_KINDS, assert_same_fields, fields
from pytorch_lightning.callbacks import Callback
from test_gpu_data_path import _graph, _item

import lightning_zerocopy.data.hybrid_lanes as hybrid_lanes_module
from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.host.share import share_node_data
from lightning_zerocopy.data.plan import PlanItem

NO_CUDA = not torch.cuda.is_available()
KINDS = NODE_KINDS + LINK_KINDS


def _reference(builder: BatchBuilder) -> BatchBuilder:
    """The CPU builder (CPU sampler, CPU gather) with ``builder``'s sampling options: the batches every lane must give."""
    return BatchBuilder(builder.handles, builder.fanouts, replace=builder.replace, num_threads=builder.num_threads,
                        node_keyed=builder.node_keyed, x_dtype=builder.x_dtype)  # fmt: skip


def _items(plan, epochs: int = 4) -> list:
    return [plan.item(epoch, step) for epoch in range(epochs) for step in range(len(plan))]


def _trainer(tmp_path: Path, accelerator: str = "cpu", **kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path), **kwargs)


@pytest.fixture
def _stand_in_lanes(monkeypatch):
    """A CPU machine's hybrid builder with both lanes, the ``gpu`` lane served by the CPU sampler (its placement is
    ``cpu``): decided at construction, so it also holds in a pipeline worker the builder is pickled to."""
    monkeypatch.setattr(hybrid_lanes_module, "cuda_usable", lambda: (True, ""))
    monkeypatch.setattr(hybrid_lanes_module, "gpu_lane_placement", lambda placement, cuda: "cpu")


@pytest.fixture
def bfs_shared(tmp_path: Path):
    data = _graph()
    handles = share_node_data(data, node_order="bfs", cache_dir=tmp_path / "order")
    yield data, handles
    handles.unlink()


# ---------------------------------------------------------------------------------------------- CPU tests


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_the_datamodules_take_hybrid_and_auto_and_name_the_key_of_another(tmp_path: Path, kind) -> None:
    for placement in ("hybrid", "auto"):
        assert kind.datamodule(tmp_path=tmp_path, sampler_placement=placement).sampler_placement == placement
    with pytest.raises(ValueError, match=r"data\.init_args\.sampler_placement must be .*'hybrid' or 'auto', got 'fastest'"):
        kind.datamodule(tmp_path=tmp_path, sampler_placement="fastest")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_builder_rejects_an_unknown_placement_listing_the_values(kind) -> None:
    dm = kind.datamodule()
    dm.setup("fit")
    try:
        with pytest.raises(ValueError, match="`sampler_placement` must be 'cpu', 'uva', 'gpu', 'hybrid' or 'auto', got 'both'"):
            BatchBuilder(dm.handles, dm.fanouts, sampler_placement="both")  # type: ignore[arg-type]
    finally:
        dm.teardown("fit")


@pytest.mark.skipif(not NO_CUDA, reason="checks a machine without a CUDA GPU")
@pytest.mark.parametrize("placement", ["hybrid", "auto"])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_hybrid_without_a_gpu_says_so_and_builds_the_cpu_batches(kind, placement: str) -> None:
    dm = kind.datamodule()
    dm.setup("fit")
    try:
        with pytest.warns(UserWarning, match=f"sampler_placement='{placement}': no CUDA GPU is visible, so sampling "
                                             "runs on the CPU only"):  # fmt: skip
            builder = BatchBuilder(dm.handles, dm.fanouts, num_threads=1, sampler_placement=placement)
        assert not builder.on_gpu and builder.hybrid_lanes is None and builder.gpu_sampler_placement == "cpu"
        assert builder.hybrid_policy() is None and builder.sampling_stats is None
        builder.open(dm.resources)
        reference = _reference(builder).open(dm.resources)
        for item in _items(dm.plan("train"), epochs=1):
            assert_same_fields(fields(builder.build_batch(item)), fields(reference.build_batch(item)), item.step)
        with pytest.raises(RuntimeError, match=r"expected_size\(\) is for hybrid builders; this one samples on 'cpu'"):
            builder.expected_size(dm.plan("train").item(0, 0))
        builder.close()
        reference.close()
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_a_lane_the_builder_does_not_have_is_rejected(_stand_in_lanes, kind) -> None:
    dm = kind.datamodule()
    dm.setup("fit")
    try:
        item = dm.plan("train").item(0, 0)
        with pytest.raises(ValueError, match=r"`lane` must be one of this builder's sampling devices None, got 'gpu'"):
            BatchBuilder(dm.handles, dm.fanouts).open(dm.resources).sample_batch(item, lane="gpu")
        hybrid = BatchBuilder(dm.handles, dm.fanouts, sampler_placement="hybrid").open(dm.resources)
        with pytest.raises(ValueError, match=r"sampling devices \('cpu', 'gpu'\), got 'tpu'"):
            hybrid.sample_batch(item, lane="tpu")
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_expected_size_sums_over_every_seeded_type(tmp_path: Path, monkeypatch, kind) -> None:
    # as on a GPU machine (the estimate itself needs no GPU); with all neighbors taken on one hop the expected size is
    # exact: the batch's edges over every edge type plus one per seed (a typed link batch seeds both endpoint types)
    monkeypatch.setattr(hybrid_lanes_module, "cuda_usable", lambda: (True, ""))
    dm = kind.datamodule(tmp_path=tmp_path, fanouts=[-1])
    dm.setup("fit")
    try:
        hybrid = BatchBuilder(dm.handles, dm.fanouts, num_threads=1, sampler_placement="hybrid")
        assert hybrid.hybrid_lanes == ("cpu", "gpu") and hybrid.on_gpu and hybrid.gpu_sampler_placement == "gpu"
        assert hybrid.hybrid_policy().lanes == ["cpu", "gpu"]
        hybrid.open(dm.resources, place=False)  # the host graph only: nothing is placed on a GPU
        reference = _reference(hybrid).open(dm.resources)
        for item in _items(dm.plan("train"), epochs=1)[:4]:
            batch = reference.build_batch(item)
            num_edges = sum(s.edge_index.shape[1] for s in (batch.edge_stores if kind.typed else [batch]))
            seeds = item.seed_ids.numel() if item.typed_seeds is None else sum(s.numel() for s in item.typed_seeds.values())
            if kind.typed and kind.task == "link":
                assert len(item.typed_seeds) == 2  # users and items
            assert hybrid.expected_size(item) == pytest.approx(num_edges + seeds)
    finally:
        dm.teardown("fit")


def test_expected_size_sums_over_the_seeds_in_the_datasets_ids(bfs_shared, monkeypatch) -> None:
    # a node order (untyped graphs only): a seed not mapped to the internal order would miss
    monkeypatch.setattr(hybrid_lanes_module, "cuda_usable", lambda: (True, ""))
    data, handles = bfs_shared
    hybrid = BatchBuilder(handles, [-1], sampler_placement="hybrid")
    reference = BatchBuilder(handles, [-1])
    for step in range(4):
        item = _item(data, step)
        batch = reference.build_batch(item)
        assert hybrid.expected_size(item) == pytest.approx(batch.edge_index.shape[1] + item.batch_size)


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_the_policy_places_batches_by_their_expected_size(monkeypatch, kind) -> None:
    """Fake lane costs over the builder's sizes: the CPU is cheap per edge, the GPU pays a fixed launch cost; once
    both are calibrated, a one-seed batch goes to the CPU and a batch of every training seed to the GPU."""
    monkeypatch.setattr(hybrid_lanes_module, "cuda_usable", lambda: (True, ""))
    dm = kind.datamodule()
    dm.setup("fit")
    try:
        hybrid = BatchBuilder(dm.handles, dm.fanouts, sampler_placement="hybrid").open(dm.resources, place=False)
        train = dm.split_tensors["train"]  # every training seed
        small, large = (hybrid.expected_size(PlanItem(ids, torch.arange(ids.numel()), 0, 0, 0, 0))
                        for ids in (train[:1], train))  # fmt: skip
        assert 0 < small < large
        per_edge = 1e-5
        launch = per_edge * (small * large) ** 0.5  # the lanes cross between the two sizes
        cost = {"cpu": lambda size: per_edge * size, "gpu": lambda size: launch + 1e-3 * per_edge * size}
        policy = hybrid.hybrid_policy()
        key = 0
        for lane in ("cpu", "gpu"):  # measure both lanes on both sizes (the first measurement of each is warm-up)
            for size in (small, large) * 4:
                policy.dispatched(lane, key, size)
                policy.finished(lane, key, size, cost[lane](size))
                key += 1
        assert policy.model("cpu").predict(small) < policy.model("gpu").predict(small)
        assert policy.choose(small, now=0.0, explore=False) == "cpu"
        assert policy.choose(large, now=0.0, explore=False) == "gpu"
        assert policy.stats.lanes["cpu"].batches == policy.stats.lanes["gpu"].batches == 8
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_hybrid_builder_used_directly_places_each_batch_and_keeps_it(tmp_path: Path, _stand_in_lanes, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path)
    dm.setup("fit")
    try:
        for split in ("train", "val"):
            cpu = dm.builder(split)
            hybrid = BatchBuilder(dm.handles, cpu.fanouts, num_threads=1, sampler_placement="hybrid",
                                  node_keyed=cpu.node_keyed).open(dm.resources)  # fmt: skip
            reference = _reference(hybrid).open(dm.resources)
            items = _items(dm.plan(split))[:12]
            for item in items:
                want = fields(reference.build_batch(item))
                for lane in ("cpu", "gpu", None):  # None: the builder's own cost model places it
                    got = fields(hybrid.gather_batch(hybrid.sample_batch(item, lane=lane)))
                    assert_same_fields(got, want, (split, lane))
                assert_same_fields(fields(hybrid.build_batch(item)), want, split)
            stats = hybrid.sampling_stats
            assert stats is not None and sum(s.batches for s in stats.lanes.values()) == 2 * len(items)
            assert all(stats.lanes[lane].batches >= 1 for lane in ("cpu", "gpu"))  # both calibrated
            hybrid.close()
            assert hybrid.sampling_stats is None  # process-local: a later open starts afresh
            reference.close()
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("mode", ["in_process", "worker"])
@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_the_producer_samples_batches_ahead_on_both_lanes(tmp_path: Path, monkeypatch, _stand_in_lanes, kind,
                                                          mode: str) -> None:  # fmt: skip
    """The pipeline producer's hybrid path (``_build_hybrid``): every batch the DataModule's own, in order, across
    epochs, and both lanes counted in the client's statistics."""
    from lightning_zerocopy.pipeline import start_pipeline
    from lightning_zerocopy.pipeline.source import PlanSource

    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # the producer opens them by name
    dm = kind.datamodule(tmp_path=tmp_path)
    dm.setup("fit")
    handles = dm.handles
    client = start_pipeline(mode, depth=2, timeout=60)
    try:
        cpu = dm.builder("train")
        hybrid = BatchBuilder(dm.handles, cpu.fanouts, num_threads=1, sampler_placement="hybrid")
        assert hybrid.hybrid_lanes == ("cpu", "gpu")
        reference = _reference(hybrid).open(dm.resources)
        plan = dm.plan("train")
        client.register("train", PlanSource(plan, hybrid))
        batches = 0
        for epoch in range(3):
            for step, batch in enumerate(client.iterate("train", epoch)):
                want = fields(reference.build_batch(plan.item(epoch, step)))
                assert_same_fields(fields(batch), want, (epoch, step))
                batches += 1
        assert batches == 3 * len(plan) > 3
        sampling = client.stats.sampling
        assert sum(lane.batches for lane in sampling.lanes.values()) == batches
        assert sampling.lanes["cpu"].batches >= 1 and sampling.lanes["gpu"].batches >= 1
        reference.close()
    finally:
        client.close()
        unlink(handles)
        dm.teardown("fit")


@pytest.mark.skipif(not NO_CUDA, reason="checks a CPU trainer on a machine without a GPU")
@pytest.mark.parametrize("placement", ["hybrid", "auto"])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_datamodule_hybrid_on_a_cpu_trainer_says_so_in_one_line(tmp_path: Path, caplog, kind, placement: str) -> None:
    dm = kind.datamodule(sampler_placement=placement, batch_size=6)
    seen = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(kind.seeds(batch).x.device.type)

    with caplog.at_level(logging.INFO):
        _trainer(tmp_path, max_steps=2, limit_val_batches=0, callbacks=[Record()]).fit(kind.model(dm), datamodule=dm)
    lines = [r.getMessage() for r in caplog.records if "sampling runs on the CPU only" in r.getMessage()]
    assert lines == [f"data.init_args.sampler_placement={placement!r}: the trainer runs on 'cpu', so sampling runs on "
                     "the CPU only"]  # fmt: skip
    assert seen == ["cpu", "cpu"] and dm._gpu.placement == "cpu"


# --------------------------------------------------------------------------------------------- CUDA tests


def _on_gpu(batch) -> bool:
    stores = [*batch.node_stores, *batch.edge_stores] if hasattr(batch, "node_types") else [batch]
    return all(v.is_cuda for s in stores for v in s.values() if isinstance(v, torch.Tensor))


@pytest.mark.cuda
@pytest.mark.parametrize("gather", ["cpu", "zerocopy"])
@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_hybrid_node_batches_are_bitwise_the_cpu_batches_on_either_lane(kind, gather: str, split: str) -> None:
    dm = kind.datamodule(sampler_placement="hybrid", gather=gather)  # no trainer: hybrid is kept where a GPU is visible
    dm.setup("fit")
    try:
        hybrid = dm.builder(split).open(dm.resources)
        assert hybrid.hybrid_lanes == ("cpu", "gpu") and hybrid.on_gpu and hybrid.gpu_sampler_placement == "gpu"
        reference = _reference(hybrid).open(dm.resources)
        items = _items(dm.plan(split))
        for item in items:
            want = fields(reference.build_batch(item))
            for lane in ("cpu", "gpu", None):  # None: the builder's own cost model places it
                got = hybrid.gather_batch(hybrid.sample_batch(item, lane=lane))
                assert _on_gpu(got)
                assert_same_fields(fields(got), want, (item.step, lane))  # x cast to float32 on the GPU
        stats = hybrid.sampling_stats
        assert stats is not None and sum(s.batches for s in stats.lanes.values()) == len(items)
        assert all(stats.lanes[lane].batches >= 1 for lane in ("cpu", "gpu"))  # both calibrated
        hybrid.close()
        reference.close()
    finally:
        dm.teardown("fit")


@pytest.mark.cuda
@pytest.mark.parametrize("neg_sampling", ["binary", {"mode": "triplet", "amount": 2}])
@pytest.mark.parametrize("gather", ["cpu", "zerocopy"])
@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_hybrid_link_batches_are_bitwise_the_cpu_batches_on_either_lane(tmp_path: Path, kind, neg_sampling,
                                                                         gather: str) -> None:  # fmt: skip
    dm = kind.datamodule(tmp_path=tmp_path, neg_sampling=neg_sampling)
    dm.setup("fit")
    try:
        for split in ("train", "val"):
            cpu = dm.builder(split).open(dm.resources)  # no trainer: the CPU builder
            hybrid = BatchBuilder(dm.handles, cpu.fanouts, num_threads=1, sampler_placement="hybrid", gather=gather,
                                  device=0, node_keyed=cpu.node_keyed).open(dm.resources)  # fmt: skip
            assert hybrid.hybrid_lanes == ("cpu", "gpu") and hybrid.on_gpu
            items = _items(dm.plan(split), epochs=2)[:12]
            for item in items:
                want = fields(cpu.build_batch(item))
                for lane in ("cpu", "gpu", None):
                    got = hybrid.gather_batch(hybrid.sample_batch(item, lane=lane))
                    assert _on_gpu(got)
                    assert_same_fields(fields(got), want, (split, item.step, lane))
            stats = hybrid.sampling_stats
            assert stats is not None and sum(s.batches for s in stats.lanes.values()) == len(items)
            hybrid.close()
            cpu.close()
    finally:
        dm.teardown("fit")


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["in_process", "worker"])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_hybrid_fit_with_the_pipeline_trains_on_the_cpu_runs_batches(tmp_path: Path, kind, mode: str) -> None:
    from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback

    def run(placement: str, callbacks: list) -> list[dict]:
        pl.seed_everything(0)
        dm = kind.datamodule(sampler_placement=placement, gather="zerocopy", batch_size=6)
        seen: list[dict] = []

        class Record(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
                seen.append(fields(batch))

        trainer = _trainer(tmp_path, "gpu", max_epochs=2, limit_val_batches=2, callbacks=[Record(), *callbacks])
        trainer.fit(kind.model(dm), datamodule=dm)
        assert placement == "cpu" or dm._gpu.placement == placement
        return seen

    telemetry = DataTelemetry(prog_bar=False)
    hybrid = run("hybrid", [PipelineCallback(mode=mode, depth=2), telemetry])
    cpu = run("cpu", [])
    assert len(hybrid) == len(cpu) > 0
    for step, (got, want) in enumerate(zip(hybrid, cpu)):
        assert_same_fields(got, want, step)
    shares = [m for m in telemetry.history if "data/share_gpu" in m]
    assert shares and shares[-1]["data/share_gpu"] + shares[-1]["data/share_cpu"] == pytest.approx(1.0)
    assert all(m["data/sample_ms"] > 0 and m["data/sample_pred_ms"] > 0 for m in shares)
