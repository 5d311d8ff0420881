"""PyG's ``to_hetero`` example module (``helpers.pyg_to_hetero.Net``: ``__init__(self, metadata, hidden_channels,
out_channels)``) trains, tests and predicts through ``lightning-zerocopy`` unchanged, on a user's saved ``HeteroData``.

The command links what the data knows (``metadata`` as tuples, ``num_features``, ``num_classes``, ``num_nodes``) into
the arguments the module has, and only those; the checkpoint records only those (``test``/``predict --ckpt_path``
rebuild the module from it); a required argument nothing gives is one line naming its key and what fills it; the
``predict_step`` hint for a module without one is written for ``HeteroData`` batches."""

from __future__ import annotations

import io
import pickle
import re
import shlex
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
import yaml

from helpers.pyg_user import MAG_CLASSES, mag_like, saved_mag_like
from lightning_zerocopy._cli_errors import TRACEBACK_ENV
from lightning_zerocopy.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def _recipe(tmp_path: Path, model: str, model_args: Optional[dict] = None, data: str = "ZeroCopyHeteroDataModule") -> Path:
    graph = saved_mag_like(tmp_path / "mag.pt")
    data_path = data if "." in data else f"lightning_zerocopy.{data}"
    recipe = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": 2, "enable_progress_bar": False,
                    "enable_model_summary": False, "default_root_dir": str(tmp_path), "log_every_n_steps": 1,
                    "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                   "init_args": {"save_last": True}}]},
        "data": {"class_path": data_path, "init_args": {
            "dataset": {"class_path": "lightning_zerocopy.datasets.PyGHeteroDataset", "init_args": {"data": str(graph)}},
            "num_neighbors": [4, 3], "batch_size": 16, "num_threads": 1}},
        "model": {"class_path": model, "init_args": {"hidden_channels": 16, **(model_args or {})}},
    }  # fmt: skip
    path = tmp_path / "to_hetero.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _hyperparameters(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["hyper_parameters"]


def test_the_pyg_example_module_fits_and_tests_from_its_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    recipe = _recipe(tmp_path, "helpers.pyg_to_hetero.Net")
    main(["fit", "--config", str(recipe)])
    (last,) = tmp_path.rglob("last.ckpt")
    saved = {k: v for k, v in _hyperparameters(last).items() if not k.startswith("_")}
    node_types, edge_types = mag_like().metadata()
    assert saved == {"metadata": (node_types, edge_types), "hidden_channels": 16, "out_channels": MAG_CLASSES}
    assert all(isinstance(e, tuple) for e in saved["metadata"][1])  # as to_hetero takes them
    main(["test", "--config", str(recipe), "--ckpt_path", str(last)])
    assert "test_acc" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:  # no predict_step: the hint is written for HeteroData batches
        main(["predict", "--config", str(recipe), "--ckpt_path", str(last)])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "helpers.pyg_to_hetero.Net has no predict_step" in lines[0], lines
    assert ("`def predict_step(self, batch, batch_idx): return self(batch.x_dict, batch.edge_index_dict)['paper']"
            "[: batch['paper'].batch_size]`") in lines[0]  # fmt: skip


def test_the_pyg_example_module_with_the_hinted_predict_step_predicts(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    recipe = _recipe(tmp_path, "helpers.pyg_to_hetero.NetWithPredictStep")
    main(["fit", "--config", str(recipe)])
    (last,) = tmp_path.rglob("last.ckpt")
    main(["predict", "--config", str(recipe), "--ckpt_path", str(last)])
    (written,) = tmp_path.rglob("predictions.npz")
    with np.load(written) as predictions:
        test_papers = mag_like()["paper"].test_mask.nonzero().view(-1)
        assert predictions["node_id"].tolist() == test_papers.tolist()
        assert predictions["logits"].shape == (test_papers.numel(), MAG_CLASSES)


def test_metadata_given_in_the_recipe_as_lists_reaches_the_module_as_tuples(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A DataModule without ``metadata``: the recipe gives it, as YAML lists, and ``to_hetero`` needs tuples."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    node_types, edge_types = mag_like().metadata()
    recipe = _recipe(tmp_path, "helpers.pyg_to_hetero.Net", {"metadata": [node_types, [list(e) for e in edge_types]]},
                     data="helpers.pyg_user.DataModuleWithoutMetadata")  # fmt: skip
    main(["fit", "--config", str(recipe), "--trainer.max_epochs=1"])
    (last,) = tmp_path.rglob("last.ckpt")
    assert _hyperparameters(last)["metadata"] == (node_types, edge_types)


@pytest.mark.parametrize("data, message", [
    ("lightning_zerocopy.ZeroCopyDataModule",
     "error: model.init_args.metadata: helpers.pyg_to_hetero.Net requires it and nothing gave it: the command fills it "
     "from data.metadata, which lightning_zerocopy.ZeroCopyDataModule does not have (a heterogeneous DataModule, e.g. "
     "lightning_zerocopy.ZeroCopyHeteroDataModule, has it); use such a DataModule or set model.init_args.metadata in "
     "the recipe"),
    (None, "error: model.init_args.hidden_channels: helpers.pyg_to_hetero.Net requires it and the recipe does not set "
           "it: set model.init_args.hidden_channels in the recipe (or pass --model.init_args.hidden_channels VALUE)"),
])  # fmt: skip
def test_a_required_model_argument_nothing_gives_is_one_line_naming_its_key(
    data: Optional[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    if data is not None:  # the quickstart's homogeneous data: no metadata to link
        args = ["--config", str(QUICKSTART), "--model", "helpers.pyg_to_hetero.Net", "--model.hidden_channels", "8"]
    else:
        recipe = yaml.safe_load(_recipe(tmp_path, "helpers.pyg_to_hetero.Net").read_text())
        del recipe["model"]["init_args"]
        path = tmp_path / "no_width.yaml"
        path.write_text(yaml.safe_dump(recipe))
        args = ["--config", str(path)]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == message, lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


def test_the_checkpoint_records_only_the_links_the_module_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A module without ``in_channels``: the linked width was recorded anyway, and ``test`` then failed with
    ``unexpected keyword argument 'in_channels'``."""
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    small = ["--config", str(QUICKSTART), "--model", "helpers.pyg_user.LazyInputSAGE",
             "--data.init_args.dataset.init_args.num_nodes=600", "--data.init_args.batch_size=64",
             "--trainer.limit_val_batches=0", "--trainer.limit_test_batches=2", "--trainer.enable_progress_bar=false",
             f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    main(["fit", *small, "--trainer.max_steps=2"])
    (last,) = tmp_path.rglob("last.ckpt")
    saved = {k: v for k, v in _hyperparameters(last).items() if not k.startswith("_")}
    assert saved == {"out_channels": 8, "hidden_channels": 64}  # the recipe's width; no in_channels
    main(["test", *small, "--ckpt_path", str(last)])
    assert "test_acc" in capsys.readouterr().out


def test_the_datamodules_metadata_is_called_as_pyg_and_read_as_a_tuple() -> None:
    from lightning_zerocopy import ZeroCopyHeteroDataModule
    from lightning_zerocopy.datasets import PyGHeteroDataset

    source = mag_like()
    dm = ZeroCopyHeteroDataModule(PyGHeteroDataset(source), num_neighbors=[2, 2], batch_size=8)
    assert dm.metadata() == source.metadata()  # PyG's HeteroData.metadata()
    node_types, edge_types = dm.metadata  # the property this package had
    assert (node_types, edge_types) == source.metadata()
    restored = pickle.loads(pickle.dumps(dm.metadata))
    assert restored == source.metadata() and restored() == source.metadata()
    buffer = io.BytesIO()  # a module's hyperparameters holding it: Lightning resumes with weights_only=True
    torch.save({"metadata": dm.metadata}, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["metadata"] == source.metadata()


def test_the_documented_to_hetero_example_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The module, recipe and commands of ``docs/USAGE.md``'s ``to_hetero`` example (the README links to it), as
    written (a smaller graph and one short epoch)."""
    usage = (ROOT / "docs" / "USAGE.md").read_text()
    section = usage[usage.index("**A PyG `to_hetero` module through the command.**"):]
    blocks = {kind: re.search(rf"```{kind}\n(.*?)```", section, flags=re.S).group(1) for kind in ("python", "yaml", "bash")}
    (tmp_path / "my_module.py").write_text(blocks["python"])
    (tmp_path / "my_mag.yaml").write_text(blocks["yaml"])
    saved_mag_like(tmp_path / "mag.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    small = ["--trainer.max_epochs=1", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
             "--data.init_args.batch_size=16", "--data.init_args.num_threads=1"]  # fmt: skip
    commands = [shlex.split(line) for line in blocks["bash"].splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [[".venv/bin/lightning-zerocopy", "fit"], [".venv/bin/lightning-zerocopy", "test"]]
    for command in commands:
        main([*command[1:], *small])
    assert "test_acc" in capsys.readouterr().out
    (last,) = tmp_path.glob("lightning_logs/my_mag/version_0/checkpoints/last.ckpt")
    assert set(_hyperparameters(last)) == {"_class_path", "_instantiator", "metadata", "hidden_channels", "out_channels"}
