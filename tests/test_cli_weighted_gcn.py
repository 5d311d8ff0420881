"""A weighted GCN written as PyG writes it (``GCNConv(...)(x, edge_index, edge_weight)``, training on the seeds its
``train_mask`` marks) trains, validates and predicts through ``lightning-zerocopy`` on a user's saved ``Data`` with
``edge_weight`` and other attributes; under Lightning's ``ddp`` on two CPU ranks and under ``ZeroCopyDDPStrategy`` on
two GPUs (GPU sampling, zero-copy gather) too. Only ``x``, ``y`` and ``edge_attr`` reached the batches: PyG's
``Data.edge_weight`` then reads ``None`` (GCNConv trains unweighted, silently) and the module stopped with
``AttributeError: 'GlobalStorage' object has no attribute 'train_mask'``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.attributes import attributed_data
from helpers.cli_jobs import command_env

from lightning_zerocopy.cli import main


def _recipe(tmp_path: Path, **trainer: object) -> Path:
    graph = tmp_path / "weighted.pt"
    torch.save(attributed_data(num_nodes=200, num_edges=1600, seed=3), graph)
    recipe = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": 2, "enable_progress_bar": False,
                    "enable_model_summary": False, "default_root_dir": str(tmp_path), "log_every_n_steps": 1,
                    "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                   "init_args": {"save_last": True}}], **trainer},
        "data": {"class_path": "lightning_zerocopy.ZeroCopyDataModule", "init_args": {
            "dataset": {"class_path": "lightning_zerocopy.datasets.PyGNodeDataset", "init_args": {"data": str(graph)}},
            "fanouts": [5, 5], "batch_size": 32, "num_threads": 1}},
        "model": {"class_path": "helpers.attributes.WeightedGCN", "init_args": {"hidden_channels": 8}},
    }  # fmt: skip
    path = tmp_path / "weighted_gcn.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_weighted_gcn_trains_and_predicts_through_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path)
    main(["fit", "--config", str(recipe)])
    (last,) = tmp_path.rglob("last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] > 0
    # the recipe key that keeps only what the module reads (the masks' memory left out)
    main(["validate", "--config", str(recipe), "--ckpt_path", str(last), "--data.init_args.attributes=[edge_weight]"])
    assert "val_acc" in capsys.readouterr().out
    main(["predict", "--config", str(recipe), "--ckpt_path", str(last)])


_ZEROCOPY_DDP = {"class_path": "lightning_zerocopy.strategies.ZeroCopyDDPStrategy", "init_args": {"cache_budget": "2KiB"}}
_GPU_DATA = {"sampler_placement": "gpu", "gather": "zerocopy"}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["cpu", pytest.param("two_gpus", marks=pytest.mark.two_gpus)])
def test_a_weighted_gcn_trains_under_ddp_on_two_ranks(tmp_path: Path, where: str) -> None:
    if where == "cpu":
        recipe = _recipe(tmp_path, devices=2, strategy="ddp", max_epochs=1)
    else:
        recipe = _recipe(tmp_path, accelerator="gpu", devices=2, strategy=_ZEROCOPY_DDP, max_epochs=1)
        config = yaml.safe_load(recipe.read_text())
        config["data"]["init_args"].update(_GPU_DATA)
        recipe.write_text(yaml.safe_dump(config))
    env = command_env(OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(recipe)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (last,) = tmp_path.rglob("last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] > 0
