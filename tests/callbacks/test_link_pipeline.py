"""The link data path through PipelineCallback (worker process and in-process), DataTelemetry and PredictionWriter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers import RecordBatches
from helpers.link import PyGLinkModule, TinyLinkGraph
from pytorch_lightning.callbacks import Callback

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.predictions import PredictionWriter

FIELDS = (
    "x", "n_id", "e_id", "edge_index", "input_id", "num_sampled_nodes", "num_sampled_edges", "batch_size",
    "edge_label_index", "edge_label", "edge_label_query",
)  # fmt: skip


def _datamodule() -> ZeroCopyLinkDataModule:
    return ZeroCopyLinkDataModule(TinyLinkGraph(num_nodes=300, num_edges=1500), num_neighbors=[4, 4], batch_size=64, seed=7)


def _trainer(tmp_path: Path, callbacks, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=str(tmp_path), callbacks=callbacks, **kwargs,
    )  # fmt: skip


def _fit(tmp_path: Path, *callbacks: Callback) -> RecordBatches:
    pl.seed_everything(0)
    dm = _datamodule()
    record = RecordBatches(FIELDS)
    _trainer(tmp_path, [*callbacks, record], max_epochs=2).fit(PyGLinkModule(dm.num_features, 16), datamodule=dm)
    return record


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_the_pipeline_builds_the_same_link_batches(tmp_path, baseline, mode):
    telemetry = DataTelemetry()
    record = _fit(tmp_path, PipelineCallback(mode=mode), telemetry)
    for got, want in ((record.train, baseline.train), (record.val, baseline.val)):
        assert got.keys() == want.keys() and len(want) > 0
        for key, batch in want.items():
            assert got[key].keys() == batch.keys()
            for field, value in batch.items():
                other = got[key][field]
                same = torch.equal(other, value) and other.dtype == value.dtype if isinstance(value, torch.Tensor) else other == value
                assert same, (key, field)
    assert "edge_label_query" in next(iter(record.val.values()))  # grouped fixed negatives survive the slots
    assert record.losses == baseline.losses
    assert len(telemetry.history) > 0 and all(0 <= m["data/stall_frac"] <= 1 for m in telemetry.history)


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
