"""Layer-wise predict on two ranks (DDP, the command's launcher): each rank computes its share of every layer's
batches into the one shared table. On CPU ranks (gloo) ``predictions.npz`` and the exported embeddings are bitwise one
rank's, for an untyped and a typed graph; on two GPUs (``two_gpus``) within 1e-6 (every node is computed in the same
batch as on one rank, but a GPU sums a node's messages with atomics, in an order that changes from run to run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from helpers.cli_jobs import command_env
from lightning_zerocopy.cli import main

TRAINER = {"accelerator": "cpu", "devices": 1, "max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 0,
           "enable_progress_bar": False, "enable_model_summary": False, "logger": False,
           "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}]}  # fmt: skip


def _untyped(cache: Path) -> dict[str, Any]:
    return {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyDataModule", "init_args": {
            "dataset": {"class_path": "lightning_zerocopy.datasets.SyntheticGraph", "init_args": {
                "num_nodes": 900, "avg_degree": 6, "num_features": 8, "num_classes": 3, "cache_dir": str(cache)}},
            "fanouts": [4, 4], "batch_size": 64, "num_threads": 1, "predict_split": "all"}},
        "model": {"class_path": "lightning_zerocopy.models.GraphSAGE",
                  "init_args": {"hidden_channels": 16, "num_layers": 3}},
    }  # fmt: skip


def _typed(cache: Path) -> dict[str, Any]:
    return {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
            "dataset": {"class_path": "helpers.hetero.TinyHeteroDataset"}, "num_neighbors": [3, 3],
            "batch_size": 8, "num_threads": 1}},
        "model": {"class_path": "lightning_zerocopy.models.HeteroNodeClassifier",
                  "init_args": {"hidden_channels": 8, "num_layers": 3}},
    }  # fmt: skip


def _predict(recipe: Path, ckpt: Path, out: Path, embeddings: Path, devices: int, tmp_path: Path,
             accelerator: str) -> str:  # fmt: skip
    env = command_env(OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "lightning_zerocopy", "predict", "--config", str(recipe), f"--ckpt_path={ckpt}",
            f"--trainer.default_root_dir={out}", f"--trainer.devices={devices}", "--trainer.strategy=ddp",
            f"--trainer.accelerator={accelerator}",
            "--data.init_args.predict_mode=layerwise", "--data.init_args.layerwise.batch_size=7",
            "--data.init_args.layerwise.embeddings=1", f"--data.init_args.layerwise.embeddings_path={embeddings}"]  # fmt: skip
    if devices == 1:
        args.remove("--trainer.strategy=ddp")
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("gpu", marks=pytest.mark.two_gpus)])
@pytest.mark.parametrize("graph", ["untyped", "typed"])
def test_two_ranks_write_the_same_bits_as_one(tmp_path: Path, graph: str, accelerator: str) -> None:
    recipe = {"seed_everything": 0, "trainer": dict(TRAINER, default_root_dir=str(tmp_path / "fit")),
              **(_untyped(tmp_path / "cache") if graph == "untyped" else _typed(tmp_path / "cache"))}  # fmt: skip
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path)])
    ckpt = next((tmp_path / "fit").rglob("last.ckpt"))
    outputs = {}
    for devices in (1, 2):
        out = tmp_path / f"ranks{devices}"
        embeddings = out / ("emb.npy" if graph == "untyped" else "emb")  # a typed graph's: a folder
        _predict(path, ckpt, out, embeddings, devices, tmp_path, accelerator)
        predictions = dict(np.load(next(out.rglob("predictions.npz"))))
        files = [embeddings] if graph == "untyped" else sorted(embeddings.glob("embeddings.*.npy"))
        outputs[devices] = predictions, {f.name: np.load(f) for f in files}
    (one, emb_one), (two, emb_two) = outputs[1], outputs[2]
    assert set(one) == set(two) and len(one["node_id"]) > 0
    for key in one:
        if accelerator == "cpu" or one[key].dtype.kind != "f":
            assert np.array_equal(one[key], two[key]), key  # bitwise
        else:
            np.testing.assert_allclose(one[key], two[key], atol=1e-6, rtol=1e-6, err_msg=key)
    assert emb_one.keys() == emb_two.keys() and emb_one
    for name in emb_one:
        if accelerator == "cpu":
            assert emb_one[name].tobytes() == emb_two[name].tobytes(), name
        else:
            np.testing.assert_allclose(emb_one[name], emb_two[name], atol=1e-6, rtol=1e-6, err_msg=name)
    if graph == "typed":
        assert sorted(emb_one) == ["embeddings.author.npy", "embeddings.paper.npy"]  # the types layer 1 outputs
