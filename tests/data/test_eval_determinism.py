"""Evaluation and prediction give every node the same sample, so the same prediction, whatever the rank count,
eval batch size or batch order (node-keyed evaluation sampling, ``ZeroCopyDataModule(eval_fanouts=...)``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pytorch_lightning as pl

from helpers.kinds import NODE_KINDS

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE

SCRIPT = Path(__file__).parents[1] / "scripts" / "eval_ddp_script.py"


def _seed_logits(dm: ZeroCopyDataModule, model: torch.nn.Module, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(node ids, logits) of every predict seed, the ranks of ``world_size`` simulated one after the other."""
    builder = dm.builder("predict").open(dm.resources)
    ids, logits = [], []
    try:
        with torch.no_grad():
            for rank in range(world_size):
                plan = dm.plan("predict", rank=rank, world_size=world_size)
                for step in range(len(plan)):
                    batch = builder.build_batch(plan.item(0, step))
                    logits.append(model(batch.x, batch.edge_index)[: batch.batch_size])
                    ids.append(batch.n_id[: batch.batch_size])
    finally:
        builder.close()
    ids_, logits_ = torch.cat(ids), torch.cat(logits)
    first = np.unique(ids_.numpy(), return_index=True)[1]  # padded shares repeat nodes: keep one row each
    return ids_[first], logits_[first]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SyntheticGraph:
    return SyntheticGraph(num_nodes=3000, avg_degree=10, num_features=16, num_classes=5,
                          cache_dir=str(tmp_path_factory.mktemp("cache")))  # fmt: skip


@pytest.mark.parametrize("eval_fanouts", [[10, 5], [4, 3, 2]])
def test_predictions_do_not_depend_on_batch_size_or_ranks(dataset: SyntheticGraph, eval_fanouts: list[int]) -> None:
    torch.manual_seed(0)
    model = GraphSAGE(16, 5, hidden_channels=32, num_layers=len(eval_fanouts)).eval()
    results = []
    for eval_batch_size, world_size in [(1000, 1), (100, 1), (37, 3), (1000, 2)]:
        dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=64, eval_fanouts=eval_fanouts,
                                eval_batch_size=eval_batch_size, predict_split="all")  # fmt: skip
        dm.setup()
        try:
            results.append(_seed_logits(dm, model, world_size))
        finally:
            dm.teardown()
    ids, logits = results[0]
    assert ids.numel() == 3000
    for other_ids, other_logits in results[1:]:
        assert torch.equal(other_ids, ids)
        assert torch.equal(other_logits, logits)  # bitwise


def test_training_batches_keep_their_per_batch_sample(dataset: SyntheticGraph) -> None:
    """Only evaluation is node-keyed: a training plan still gives each batch its own sampler seed and sample."""
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=64)
    dm.setup()
    try:
        train, val = dm.plan("train"), dm.plan("val")
        assert train.item(0, 0).batch_seed != train.item(0, 1).batch_seed
        assert val.item(0, 0).batch_seed == val.item(3, 1).batch_seed
        assert not dm.builder("train").node_keyed and dm.builder("val").node_keyed
    finally:
        dm.teardown()
    full = ZeroCopyDataModule(dataset, fanouts=[10, 5], eval_fanouts=[-1, -1])
    assert not full._eval_node_keyed  # all neighbors: a batch's sample is already exact


def _predicting(tmp_path: Path, kind, **kwargs):
    """A kind's DataModule (eval batches of 4), its model (seeded, ``tested`` by node id) and a trainer writing
    ``tmp_path / "predictions.npz"``."""
    dm = kind.datamodule(eval_batch_size=4, **kwargs)
    torch.manual_seed(0)
    model = kind.model(dm).eval()
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[PredictionWriter(str(tmp_path))])  # fmt: skip
    return dm, model, trainer


@pytest.mark.parametrize("predict_split", ["test", "val"])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_predict_gives_a_node_the_logits_its_evaluation_gave_bitwise(tmp_path: Path, kind, predict_split: str) -> None:
    """``predict`` samples its split with that split's seed: a test node's predicted logits are its test-step logits.
    The file holds the seeds' node type (typed graphs)."""
    dm, model, trainer = _predicting(tmp_path, kind, predict_split=predict_split)
    if predict_split == "test":
        trainer.test(model, datamodule=dm, verbose=False)
    else:  # validate: the same node-keyed sampling with the val split's seed
        model.validation_step = model.test_step  # type: ignore[method-assign]
        trainer.validate(model, datamodule=dm, verbose=False)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    saved = dict(np.load(tmp_path / "predictions.npz"))  # no pickle: node_type is a plain string array
    assert ("node_type" in saved) == kind.typed and (not kind.typed or str(saved["node_type"]) == kind.input_type)
    split_ids = sorted(dm.dataset.load().split(predict_split).tolist())
    assert saved["node_id"].tolist() == split_ids == sorted(model.tested)  # 10 nodes, in 3 batches of 4
    for row, node in enumerate(saved["node_id"].tolist()):
        assert np.array_equal(saved["logits"][row], model.tested[node].numpy()), node
    assert saved["pred"].tolist() == saved["logits"].argmax(1).tolist()


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_predict_all_writes_one_row_per_input_node(tmp_path: Path, kind) -> None:
    dm, model, trainer = _predicting(tmp_path, kind, predict_split="all")
    trainer.predict(model, datamodule=dm, return_predictions=False)
    saved = dict(np.load(tmp_path / "predictions.npz"))
    assert not kind.typed or str(saved["node_type"]) == kind.input_type
    assert saved["node_id"].tolist() == list(range(40))  # every seed-type node once: no other type's ids
    assert saved["logits"].shape == (40, 3)


def _predict(tmp_path: Path, devices: int, eval_batch_size: int) -> dict[str, np.ndarray]:
    out = tmp_path / f"d{devices}-b{eval_batch_size}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(tmp_path / "cache"), str(devices), str(eval_batch_size)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return dict(np.load(out / "predictions.npz"))


@pytest.mark.slow
def test_predictions_are_bitwise_equal_on_one_and_two_gloo_ranks(tmp_path: Path) -> None:
    """The quickstart-size graph (20k nodes, 4,000 test nodes), eval_fanouts [10, 5]: the PredictionWriter's file
    is bitwise the same on 1 and 2 ranks and with eval batch sizes 100 and 1000."""
    reference = _predict(tmp_path, 1, 1000)
    assert reference["node_id"].shape == (4000,)
    for devices, eval_batch_size in [(2, 1000), (1, 100)]:
        other = _predict(tmp_path, devices, eval_batch_size)
        for key in ("node_id", "logits", "pred", "prob"):
            assert np.array_equal(other[key], reference[key]), (devices, eval_batch_size, key)
