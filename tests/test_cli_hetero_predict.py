"""``lightning-zerocopy predict`` with ZeroCopyHeteroDataModule: predictions.npz holds the input type's test nodes,
their ids of that type, and names the type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers.hetero import PAPER, TinyHeteroDataset
from lightning_zerocopy.cli import main


def test_predict_writes_the_input_types_ids_and_names_the_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = {
        "model": {"class_path": "helpers.hetero.HeteroLinear"},
        "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
            "dataset": {"class_path": "helpers.hetero.TinyHeteroDataset"}, "num_neighbors": [2, 1],
            "batch_size": 4, "eval_batch_size": 3, "num_threads": 1}},
        "trainer": {"accelerator": "cpu", "devices": 1, "logger": False, "enable_progress_bar": False,
                    "default_root_dir": str(tmp_path)},
    }  # fmt: skip
    path = tmp_path / "hetero.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["predict", "--config", str(path), "--allow_untrained", "true"])
    (written,) = tmp_path.rglob("predictions.npz")
    saved = dict(np.load(written))
    assert str(saved["node_type"]) == PAPER
    assert saved["node_id"].tolist() == sorted(TinyHeteroDataset().load().test_idx.tolist())  # 10 of 40 papers
    assert saved["logits"].shape == (10, 3) and saved["pred"].tolist() == saved["logits"].argmax(1).tolist()
    np.testing.assert_allclose(saved["prob"], torch.from_numpy(saved["logits"]).softmax(1).max(1).values.numpy(),
                               rtol=1e-6)  # fmt: skip
