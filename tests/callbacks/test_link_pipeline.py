"""The link data path through PipelineCallback (worker process and in-process), DataTelemetry and PredictionWriter; the
pipeline's batches and resumed epochs on both graph kinds (``kind``: ``helpers.kinds``; a typed batch crosses the slots
flattened, its supervision fields on the typed stores)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers import RecordBatches
from helpers.kinds import LINK_KINDS, assert_same_fields, fields
from helpers.link import PyGLinkModule, TinyLinkGraph
from pytorch_lightning.callbacks import Callback

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.data.handles import HostGraphHandles

UNTYPED, TYPED = LINK_KINDS
TRIPLET = {"mode": "triplet", "amount": 2}


class _Record(RecordBatches):
    """Every field of every store of each batch (:func:`helpers.kinds.fields`), and every training loss."""

    def _freeze(self, batch) -> dict:
        return fields(batch)


def _datamodule(kind=UNTYPED, tmp_path: Path = Path(), **kwargs):
    """The untyped kind: 300 nodes, 1500 edges, 4 + 4 neighbors, batches of 64; the typed one: ``small_graph`` (cached
    beside ``tmp_path``), 3 + 2 neighbors, batches of 64, eval batches of 24."""
    if kind.typed:
        return kind.datamodule(tmp_path=tmp_path.parent, batch_size=64, eval_batch_size=24, **kwargs)
    return ZeroCopyLinkDataModule(TinyLinkGraph(num_nodes=300, num_edges=1500), num_neighbors=[4, 4], batch_size=64,
                                  seed=7, **kwargs)  # fmt: skip


def _trainer(tmp_path: Path, callbacks, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=str(tmp_path), callbacks=callbacks, **kwargs,
    )  # fmt: skip


def _fit(tmp_path: Path, kind, neg_sampling, *callbacks: Callback) -> _Record:
    """Two epochs (the typed kind: 4 training batches each) of the PyG-style module (untyped) or the package's typed
    link predictor."""
    pl.seed_everything(0)
    dm = _datamodule(kind, tmp_path, neg_sampling=neg_sampling)
    model = kind.model(dm) if kind.typed else PyGLinkModule(dm.num_features, 16)
    record = _Record(())
    limit = dict(limit_train_batches=4) if kind.typed else {}
    _trainer(tmp_path, [*callbacks, record], max_epochs=2, **limit).fit(model, datamodule=dm)
    return record


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict:
    """The batches and losses without the pipeline, by (kind, neg_sampling), fitted on first use."""
    root, fitted = tmp_path_factory.mktemp("baseline"), {}

    def get(kind, neg_sampling):
        key = (str(kind), str(neg_sampling))
        if key not in fitted:
            fitted[key] = _fit(root / str(len(fitted)) / "fit", kind, neg_sampling)
        return fitted[key]

    return get


@pytest.mark.parametrize(("kind", "mode", "neg_sampling"), [
    (UNTYPED, "worker", "binary"), (UNTYPED, "in_process", "binary"), (TYPED, "worker", "binary"),
    (TYPED, "in_process", "binary"), (TYPED, "in_process", TRIPLET),
], ids=lambda v: str(v) if not isinstance(v, dict) else "triplet")  # fmt: skip
def test_the_pipeline_builds_the_same_link_batches(tmp_path, baselines, kind, mode, neg_sampling):
    """Every train and val batch (the last one smaller: edge_label_index varies along its second dimension in the slot),
    every field bitwise, and the same losses."""
    baseline = baselines(kind, neg_sampling)
    telemetry = DataTelemetry(prog_bar=False)
    record = _fit(tmp_path / "fit", kind, neg_sampling, PipelineCallback(mode=mode), telemetry)
    for got, want in ((record.train, baseline.train), (record.val, baseline.val)):
        assert got.keys() == want.keys() and len(want) > 0
        for key, batch in want.items():
            assert_same_fields(got[key], batch, key)
    assert any(field == "edge_label_query" for _, field in next(iter(record.val.values())))  # grouped negatives
    assert record.losses == baseline.losses
    steps = telemetry.history  # per step: the stall, the producer's build time, the rows of each endpoint type
    assert len(steps) > 0 and all(0 <= s["data/stall_frac"] <= 1 and s["data/build_ms"] > 0 for s in steps)
    if kind.typed:
        assert all(s["data/rows_user"] > 0 and s["data/rows_item"] > 0 for s in steps)


@pytest.mark.parametrize("pipelined", [False, True])
def test_prediction_writer_writes_the_scored_edges(tmp_path, pipelined):
    dm = _datamodule()
    model = PyGLinkModule(dm.num_features, 16)
    writer = PredictionWriter(output_dir=str(tmp_path))
    callbacks = [writer] + ([PipelineCallback(mode="in_process")] if pipelined else [])
    _trainer(tmp_path, callbacks).predict(model, datamodule=dm, return_predictions=False)
    p = np.load(writer.path)
    test = dm.dataset.load().split("test")
    k = test.neg_per_positive
    assert set(p.files) == {"src", "dst", "score", "label", "query"}
    queries = torch.cat([torch.arange(test.num_positives), torch.arange(test.num_positives).repeat_interleave(k)])
    edges = torch.cat([test.pos_edge_index, test.neg_edge_index], 1)
    expected = {(int(s), int(d), int(q)) for (s, d), q in zip(edges.t(), queries)}
    assert {(int(s), int(d), int(q)) for s, d, q in zip(p["src"], p["dst"], p["query"])} == expected
    assert len(p["src"]) == len(expected)  # every positive and fixed negative scored, each (pair, query) once
    pos = {(int(s), int(d)) for s, d in test.pos_edge_index.t()}
    got_pos = {(int(s), int(d)) for s, d, lab in zip(p["src"], p["dst"], p["label"]) if lab > 0}
    assert got_pos == pos
    neg = {(int(s), int(d)) for s, d in test.neg_edge_index.t()}
    assert {(int(s), int(d)) for s, d, lab in zip(p["src"], p["dst"], p["label"]) if lab == 0} == neg
    assert np.all((p["score"] >= 0) & (p["score"] <= 1))
    order = np.lexsort((p["dst"], p["src"]))
    assert np.array_equal(order, np.arange(len(order)))  # sorted by (src, dst)


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_the_pipeline_loader_deals_an_epoch_resumed_on_another_world_size_like_the_plan_loader(tmp_path: Path, kind,
                                                                                              monkeypatch) -> None:  # fmt: skip
    """A 2-rank checkpoint resumed on 1 rank: the producer builds the remainder link batches the PlanLoader would
    (the resumed link plan is registered with it), and they train the edges the 2 ranks had left."""
    from lightning_zerocopy.pipeline import start_pipeline
    from lightning_zerocopy.pipeline.loader import PipelineLoader
    from lightning_zerocopy.pipeline.source import PlanSource

    dm = _datamodule(kind, tmp_path / "dm")
    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # the producer opens them by name
    dm.setup("fit")
    handles = dm.handles
    client = start_pipeline("in_process", depth=2, timeout=30)
    try:
        client.register("train", PlanSource(dm.plan("train"), dm.builder("train")))
        state = dm.train_dataloader().state_dict()
        state.update(epoch=1, step=2, segments=[[2, 64, 2]])
        state["plan"] = dict(state["plan"], world_size=2)
        piped = PipelineLoader(client, "train", dm.train_dataloader())
        piped.load_state_dict(state)
        fresh = dm.train_dataloader()
        fresh.load_state_dict(state)
        start = fresh.start_step
        assert piped.start_step == start > 0
        later = []
        for step, (a, b) in enumerate(zip(piped, fresh)):  # in lockstep: a slot's batch is valid until the next one
            assert_same_fields(fields(a), fields(b), step)
            later += kind.label_store(b, kind.supervised(dm)).input_id.tolist()
        assert len(later) > 0
        two_ranks = [dm.plan("train", rank=r, world_size=2) for r in range(2)]
        done = {int(i) for p in two_ranks for step in range(2) for i in p.item(1, step).input_id}
        assert not done & set(later) and len(done) + len(later) == dm.link_splits["train"].num_positives
    finally:
        client.close()
        unlink(handles)
        dm.teardown("fit")
