"""The ``lightning-zerocopy`` command: the quickstart recipe end to end, config errors, print_config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lightning_zerocopy._cli_errors import TRACEBACK_ENV
from lightning_zerocopy.cli import CommandError, build_cli, main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LIGHTNING_ZEROCOPY_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "lightning_zerocopy", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_quickstart_recipe_fits_a_few_steps_through_the_entry_point(tmp_path: Path) -> None:
    proc = _run(
        [
            "fit",
            "--config",
            str(QUICKSTART),
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=2",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "`Trainer.fit` stopped: `max_steps=3` reached." in proc.stderr + proc.stdout
    checkpoints = list(tmp_path.rglob("*.ckpt"))
    assert checkpoints, "fit must write a checkpoint"
    config = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())
    assert config["model"]["class_path"] == "lightning_zerocopy.models.GraphSAGE"


def test_misspelled_key_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_cli(["--config", str(QUICKSTART), "--data.init_args.batch_sise=8"], run=False)
    assert exit_info.value.code != 0
    assert "batch_sise" in capsys.readouterr().err


def test_misspelled_key_in_a_recipe_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = yaml.safe_load(QUICKSTART.read_text())
    recipe["model"]["init_args"]["hiden_channels"] = recipe["model"]["init_args"].pop("hidden_channels")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit):
        build_cli(["--config", str(path)], run=False)
    assert "hiden_channels" in capsys.readouterr().err


@pytest.mark.parametrize(
    "edit, expected",
    [
        (("trainer", "max_epochs", "max_epoch"), "`trainer.max_epoch` is not an option: did you mean `trainer.max_epochs`?"),
        (("model", "init_args", "hidden_channels", "hiden_channels"),
         "`model.init_args.hiden_channels` is not an option of lightning_zerocopy.models.GraphSAGE: did you mean "
         "`hidden_channels`?"),
        (("model", "init_args", "optimizer", "init_args", "lr", "lrr"),
         "`model.init_args.optimizer.init_args.lrr` is not an option of torch.optim.Adam: did you mean `lr`?"),
    ],
)
def test_a_misspelled_key_in_a_recipe_is_named_first_with_the_closest_valid_one(
    edit: tuple[str, ...], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    recipe = yaml.safe_load(QUICKSTART.read_text())
    *parents, old, new = edit
    node = recipe
    for key in parents:
        node = node[key]
    node[new] = node.pop(old)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == f"error: {expected}", lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


def test_wrong_type_fails_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_cli(["--config", str(QUICKSTART), "--data.init_args.batch_size=many"], run=False)
    assert "batch_size" in capsys.readouterr().err


def test_links_data_shape_into_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    cli = build_cli(
        ["--config", str(QUICKSTART), "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"], run=False
    )
    assert cli.model.hparams.in_channels == cli.datamodule.num_features == 32
    assert cli.model.hparams.out_channels == cli.datamodule.num_classes == 8


def test_print_config_shows_the_full_recipe(tmp_path: Path) -> None:
    proc = _run(["fit", "--config", str(QUICKSTART), "--print_config"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["data"]["init_args"]["fanouts"] == [10, 5]
    assert printed["model"]["init_args"]["optimizer"]["class_path"] == "torch.optim.Adam"


def test_a_users_module_is_chosen_by_class_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user_gnn_for_cli_test.py").write_text(
        "import pytorch_lightning as pl\n"
        "from torch_geometric.nn import SAGEConv\n"
        "class UserGNN(pl.LightningModule):\n"
        "    def __init__(self, in_channels: int, out_channels: int, width: int = 8):\n"
        "        super().__init__()\n"
        "        self.save_hyperparameters()\n"
        "        self.conv = SAGEConv(in_channels, out_channels)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    cli = build_cli(
        [
            "--config",
            str(QUICKSTART),
            "--model=user_gnn_for_cli_test.UserGNN",
            "--model.width=3",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    assert type(cli.model).__name__ == "UserGNN"
    hparams = {k: v for k, v in cli.model.hparams.items() if not k.startswith("_")}
    assert hparams == {"in_channels": 32, "out_channels": 8, "width": 3}


def _recipe(tmp_path: Path, name: str, callbacks) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(path)


def test_the_command_reads_an_mps_request_from_the_recipes(tmp_path: Path) -> None:
    from lightning_zerocopy.cli import mps_requested_by

    pipeline = "lightning_zerocopy.callbacks.PipelineCallback"
    on = _recipe(tmp_path, "on.yaml", [{"class_path": pipeline, "init_args": {"mps": True, "worker_sm_percent": 20}}])
    default = _recipe(tmp_path, "default.yaml", [{"class_path": "PipelineCallback", "init_args": {"mps": True}}])
    off = _recipe(tmp_path, "off.yaml", [{"class_path": pipeline, "init_args": {"mps": False}}])
    thread = _recipe(tmp_path, "thread.yaml", [{"class_path": pipeline, "init_args": {"mps": True, "mode": "in_process"}}])
    other = _recipe(tmp_path, "other.yaml", [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint"}])
    assert mps_requested_by(["fit", "--config", on]) == 20
    assert mps_requested_by(["fit", f"--config={default}"]) == 10
    assert mps_requested_by(["-c", on, "test"]) == 20
    assert mps_requested_by(["fit", "--config", on, "--config", off]) is None  # the last recipe's callbacks win
    assert mps_requested_by(["fit", "--config", off, "--config", on]) == 20
    auto = _recipe(tmp_path, "auto.yaml", [{"class_path": pipeline, "init_args": {"mps": True, "worker_sm_percent": "auto"}}])
    assert mps_requested_by(["fit", "--config", auto]) == 10  # the trainer gets 100 - the ladder's smallest share
    for bad in (150, 0, "ten"):  # left to LightningCLI, whose error names the key
        bad_share = _recipe(tmp_path, "bad.yaml", [{"class_path": pipeline, "init_args": {"mps": True, "worker_sm_percent": bad}}])
        assert mps_requested_by(["fit", "--config", bad_share]) is None, bad
    for args in (["fit", "--config", thread], ["fit", "--config", other], ["fit", "--config", str(tmp_path / "nope.yaml")],
                 ["fit", "--config", on, "--print_config"], ["fit", "--config", on, "--help"], ["--config", on]):  # fmt: skip
        assert mps_requested_by(args) is None, args


def test_the_command_reads_the_trainers_own_share_from_the_recipe(tmp_path: Path) -> None:
    from lightning_zerocopy.cli import mps_requested_by, trainer_share_requested_by

    pipeline = "lightning_zerocopy.callbacks.PipelineCallback"

    def recipe(**init_args) -> list[str]:
        return ["fit", "--config", _recipe(tmp_path, "r.yaml", [{"class_path": pipeline, "init_args": init_args}])]

    assert trainer_share_requested_by(recipe(mps=True, worker_sm_percent=20, trainer_sm_percent=100)) == 100
    assert mps_requested_by(recipe(mps=True, worker_sm_percent=20, trainer_sm_percent=100)) == 20
    assert trainer_share_requested_by(recipe(mps=True, worker_sm_percent=20)) is None  # 100 - 20
    assert trainer_share_requested_by(recipe(mps=False, trainer_sm_percent=100)) is None  # no MPS asked for
    for bad in (0, 101, "all", True):  # left to LightningCLI, whose error names the key
        assert trainer_share_requested_by(recipe(mps=True, trainer_sm_percent=bad)) is None, bad


def test_the_command_starts_mps_before_anything_imports_pyg(tmp_path: Path) -> None:
    """``import torch_geometric`` initializes CUDA, after which the trainer could no longer become an MPS client:
    the command must have started the daemon (here: recorded by a stand-in) before the recipe's classes load."""
    recipe = _recipe(tmp_path, "on.yaml", [{"class_path": "PipelineCallback",
                                            "init_args": {"mps": True, "worker_sm_percent": 30, "trainer_sm_percent": 100}}])
    script = f"""
import sys
import lightning_zerocopy.cli as cli
import lightning_zerocopy.pipeline.mps_launcher as mps_launcher
calls = []
mps_launcher.start_for_trainer = lambda percent, trainer: calls.append((percent, trainer, "torch_geometric" in sys.modules))
cli.build_cli = lambda args: calls.append(("cli", "torch_geometric" in sys.modules))
cli.main(["fit", "--config", {recipe!r}])
print(calls)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[(30, 100, False), ('cli', False)]"


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_parses_through_the_command(tmp_path: Path, recipe: str) -> None:
    """Keys and types of every shipped recipe are valid (--print_config parses and links without building data)."""
    proc = _run(["fit", "--config", str(ROOT / "recipes" / recipe), "--print_config"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["data"]["class_path"] and printed["model"]["class_path"]


def _checkpoint_callbacks(recipe: Path) -> list[dict]:
    callbacks = yaml.safe_load(recipe.read_text())["trainer"].get("callbacks") or []
    return [c.get("init_args") or {} for c in callbacks if c["class_path"].endswith(".ModelCheckpoint")]


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_writes_the_last_epochs_weights_to_last_ckpt(recipe: str) -> None:
    """Lightning (2.6) writes ``last.ckpt`` only when the same ModelCheckpoint saves a checkpoint: one that monitors a
    metric leaves it at the last epoch that improved the metric. The checkpoint that writes it monitors nothing."""
    writers = [c for c in _checkpoint_callbacks(ROOT / "recipes" / recipe) if c.get("save_last")]
    assert len(writers) == 1 and writers[0].get("monitor") is None, writers


def test_last_ckpt_holds_the_last_epoch_after_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    build_cli(["fit", "--config", str(QUICKSTART), *_SMALL, "--trainer.max_epochs=2", "--trainer.limit_train_batches=3",
               "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
               f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    saved = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=False)
    assert (saved["epoch"], saved["global_step"]) == (1, 6)


# ---- evaluation needs a checkpoint (issue 10, item 1) ----


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_without_a_checkpoint_is_refused(subcommand: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, "--config", str(QUICKSTART)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--ckpt_path" in err and "--allow_untrained true" in err and "Traceback" not in err


@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_a_checkpoint_path_that_does_not_exist_is_one_line_before_any_data_is_built(
    subcommand: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, "--config", str(QUICKSTART), "--ckpt_path", str(missing)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--ckpt_path {missing}: no such checkpoint file" in err and "Traceback" not in err


def test_evaluation_of_the_untrained_model_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    cli = build_cli(["test", "--config", str(QUICKSTART), "--allow_untrained=true", *_SMALL, *_QUIET(tmp_path)])
    assert "test_acc" in cli.trainer.callback_metrics


# ---- user errors: one message naming the YAML key (item 5) ----

_SMALL = ["--data.init_args.dataset.init_args.num_nodes=600", "--trainer.limit_test_batches=2",
          "--trainer.limit_predict_batches=3", "--data.init_args.batch_size=64"]  # fmt: skip


def _QUIET(tmp_path: Path) -> list[str]:
    return ["--trainer.logger=false", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["--data.init_args.fanouts=[10,-2]"], "`data.init_args.fanouts[1]` must be a positive neighbor count"),
        (["--data.init_args.batch_size=0"], "data.init_args.batch_size must be >= 1, got 0"),
        (["--model=lightning_zerocopy.models.GAT", "--model.init_args.heads=3"],
         "model.init_args.hidden_channels (64) must be divisible by model.init_args.heads (3)"),
    ],
)
def test_a_build_error_prints_one_message_naming_the_key(
    overrides: list[str], expected: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), *overrides, *_QUIET(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and expected in lines[0], err
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], err
    assert "Traceback" not in err and "Namespace(" not in err


def test_a_missing_dataset_folder_names_the_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(QUICKSTART), "--data.init_args.dataset=lightning_zerocopy.datasets.OGBNodeDataset",
              f"--data.init_args.dataset.root={tmp_path / 'nope'}", *_QUIET(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert "`data.init_args.dataset.init_args.root` must be an OGB node dataset folder" in err
    assert str(tmp_path / "nope") in err and "Traceback" not in err


def test_the_full_traceback_on_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(CommandError, match="data.init_args.batch_size") as info:
        main(["fit", "--config", str(QUICKSTART), "--data.init_args.batch_size=0", *_QUIET(tmp_path)])
    assert isinstance(info.value.__cause__, ValueError)  # the original exception, chained


def test_a_parse_error_prints_the_message_without_the_usage_block(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), "--data.init_args.batch_sise=8"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "batch_sise" in err and "usage:" not in err and "Given value" not in err
    assert "lightning-zerocopy fit --help" in err and len(err.splitlines()) <= 6, err


# ---- --help (item 6) ----


def test_help_says_what_the_command_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Lightning Trainer command line tool" not in out
    assert out.startswith("usage: lightning-zerocopy")
    assert str(ROOT / "recipes") in out and "--data.help" in out and "--model.help" in out


# ---- predictions on disk (item 2) ----


def test_predict_writes_the_predictions_to_the_log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    fit = build_cli(["fit", "--config", str(QUICKSTART), "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                     *_SMALL, *_QUIET(tmp_path)[1:]])  # fmt: skip
    ckpt = fit.trainer.checkpoint_callback.best_model_path
    capsys.readouterr()
    cli = build_cli(["predict", "--config", str(QUICKSTART), "--ckpt_path", ckpt, *_SMALL, *_QUIET(tmp_path)[1:]])
    path = Path(cli.trainer.log_dir) / "predictions.npz"
    assert f"written to {path}" in capsys.readouterr().out
    saved = dict(np.load(path))
    assert np.array_equal(saved["node_id"], np.unique(saved["node_id"])) and len(saved["node_id"]) == 120  # the test split
    assert 0 <= saved["node_id"].min() and saved["node_id"].max() < 600
    assert saved["logits"].shape == (120, 8) and np.array_equal(saved["pred"], saved["logits"].argmax(1))
    assert ((saved["prob"] > 0) & (saved["prob"] <= 1)).all()


_USER_MODULES = """
import pytorch_lightning as pl
from torch_geometric.nn import SAGEConv

class NoPredictStep(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)

class LogitsOnly(NoPredictStep):
    def predict_step(self, batch, batch_idx):
        return self(batch.x, batch.edge_index)  # all sampled nodes: the writer keeps the seeds' rows
"""


def test_a_module_without_predict_step_gets_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "user_modules_for_predict.py").write_text(_USER_MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit):
        main(["predict", "--config", str(QUICKSTART), "--model=user_modules_for_predict.NoPredictStep",
              "--allow_untrained=true", *_SMALL, *_QUIET(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert "has no predict_step" in err and "def predict_step(self, batch, batch_idx)" in err
    assert "missing 1 required positional argument" not in err


def test_a_module_returning_logits_gets_predictions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user_modules_for_predict.py").write_text(_USER_MODULES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    build_cli(["predict", "--config", str(QUICKSTART), "--model=user_modules_for_predict.LogitsOnly",
               "--allow_untrained=true", *_SMALL, *_QUIET(tmp_path)])  # fmt: skip
    saved = np.load(tmp_path / "predictions.npz")  # no logger: the log dir is default_root_dir
    assert saved["node_id"].shape == (120,) and saved["logits"].shape == (120, 8)


def test_a_configured_writer_replaces_the_default_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    writer = {"class_path": "lightning_zerocopy.callbacks.predictions.PredictionWriter",
              "init_args": {"output_dir": str(tmp_path / "mine"), "filename": "out.npz"}}  # fmt: skip
    cli = build_cli(["predict", "--config", str(QUICKSTART), "--allow_untrained=true", *_SMALL, *_QUIET(tmp_path),
                     f"--trainer.callbacks={json.dumps([writer])}"])  # fmt: skip
    from pytorch_lightning.callbacks import BasePredictionWriter

    assert len([c for c in cli.trainer.callbacks if isinstance(c, BasePredictionWriter)]) == 1
    assert (tmp_path / "mine" / "out.npz").exists() and not (tmp_path / "predictions.npz").exists()


def _gz(path: Path, text: str) -> None:
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))


def test_a_bad_dataset_file_found_during_the_run_prints_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A DatasetFileError raised in prepare_data (inside trainer.fit) ended the command with a 74-line traceback."""
    root = tmp_path / "ogbn_bad"
    _gz(root / "raw" / "edge.csv.gz", "0,1\n1,2\n2,9\n")  # node 9 of 4
    _gz(root / "raw" / "node-feat.csv.gz", "0.1,0.2\n0.3,0.4\n0.5,0.6\n0.7,0.8\n")
    _gz(root / "raw" / "node-label.csv.gz", "0\n1\n0\n1\n")
    for name, ids in (("train", "0\n1\n"), ("valid", "2\n"), ("test", "3\n")):
        _gz(root / "split" / "s" / f"{name}.csv.gz", ids)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), "--data.init_args.dataset=lightning_zerocopy.datasets.OGBNodeDataset",
              f"--data.init_args.dataset.root={root}", f"--data.init_args.dataset.cache_dir={tmp_path / 'cache'}",
              *_QUIET(tmp_path)])  # fmt: skip
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == f"error: {root / 'raw' / 'edge.csv.gz'}, line 3: node id 9 is out of range: the graph has 4 nodes " \
                       "(node-label.csv.gz has 4 rows)", lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1]


def test_ckpt_path_last_resumes_from_the_previous_runs_version_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new run gets a new version folder, where Lightning alone finds no last.ckpt and trains from step 0."""
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    # the recipe's ModelCheckpoint writes last.ckpt
    common = ["--config", str(QUICKSTART), *_SMALL, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"]
    first = build_cli(["fit", *common, "--trainer.max_steps=3"])
    saved = Path(first.trainer.checkpoint_callback.last_model_path)
    assert first.trainer.global_step == 3 and saved.name == "last.ckpt" and "version_0" in str(saved)
    second = build_cli(["fit", *common, "--trainer.max_steps=5", "--ckpt_path=last"])
    assert second.trainer.ckpt_path == str(saved)  # restored from the first run's folder
    assert "version_1" in second.trainer.checkpoint_callback.last_model_path
    assert torch.load(second.trainer.checkpoint_callback.last_model_path, weights_only=False)["global_step"] == 5


def test_ckpt_path_last_without_any_checkpoint_names_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), *_SMALL, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path=last",
              "--trainer.enable_progress_bar=false"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--ckpt_path last: no last.ckpt under {tmp_path.resolve() / 'lightning_logs'}" in err and "Traceback" not in err


def test_main_frees_the_finished_run_before_the_process_exits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The trainer, its strategy and the DataModule sit in reference cycles that Python need not free before the
    process exits; with a pipeline worker, the CUDA storages they hold were shared over CUDA IPC, and torch's check
    at the very end of the process then printed "Producer process has been terminated before all shared CUDA tensors
    released" (seen on an H100 with recipes/gpu_zerocopy.yaml). ``main`` frees the run before it returns."""
    import gc

    from pytorch_lightning import Trainer

    from lightning_zerocopy import ZeroCopyDataModule

    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    gc.collect()
    before = sum(isinstance(o, (Trainer, ZeroCopyDataModule)) for o in gc.get_objects())
    main(["fit", "--config", str(QUICKSTART), "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
          *_QUIET(tmp_path)])  # fmt: skip
    left = [type(o).__name__ for o in gc.get_objects() if isinstance(o, (Trainer, ZeroCopyDataModule))]
    assert len(left) == before, f"still alive after main returned: {left}"


_MODULE_HERE = """
import pytorch_lightning as pl
from torch_geometric.nn import SAGEConv

class HereGNN(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int, width: int = 7):
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)
"""


def test_a_module_in_the_current_folder_is_found_by_the_console_script_as_by_python_m(tmp_path: Path) -> None:
    """``python -m`` puts the current folder on sys.path; the console script puts its own folder there."""
    script = Path(sys.executable).with_name("lightning-zerocopy")
    if not script.exists():
        pytest.skip(f"the console script is not installed next to {sys.executable}")
    (tmp_path / "here_module.py").write_text(_MODULE_HERE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    outputs = []
    for command in ([str(script)], [sys.executable, "-m", "lightning_zerocopy"]):
        proc = subprocess.run([*command, "fit", "--config", str(QUICKSTART), "--model=here_module.HereGNN",
                               "--print_config"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        outputs.append(yaml.safe_load(proc.stdout)["model"])
    assert outputs[0] == outputs[1] and outputs[0]["class_path"] == "here_module.HereGNN"


def _bad_pyg_graph(path: Path, fault: str) -> None:
    """A 200-node PyG graph with train/val/test masks, with one fault."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(0)
    n = 200
    edge_index, x, y = torch.randint(0, n, (2, 1000), generator=gen), torch.randn(n, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen)
    split = torch.randperm(n, generator=gen)
    masks = {name: torch.isin(torch.arange(n), split[a:b]) for name, a, b in (("train", 0, 120), ("val", 120, 160), ("test", 160, n))}
    if fault == "float":
        edge_index = edge_index.float()
        edge_index[1, 17] = 2.5
    elif fault in ("big", "negative"):
        edge_index[0 if fault == "big" else 1, 33] = 205 if fault == "big" else -1
    elif fault == "rows":
        x = x[:190]
    data = Data(edge_index=edge_index, x=x, y=y, **{f"{k}_mask": v for k, v in masks.items()})
    if fault == "rows":  # index splits: the edges were blamed
        for name in masks:
            data[f"{name}_idx"] = data.pop(f"{name}_mask").nonzero().view(-1)
    torch.save(data, path)


@pytest.mark.parametrize("fault, message", [
    ("float", "data.edge_index holds 2.5, which is not a node id (at edge_index[1, 17]): store integers"),
    ("big", "data.edge_index holds node id 205 at edge_index[0, 33] (a source), but data.x has 200 rows (node ids 0 to 199)"),
    ("negative", "data.edge_index holds node id -1 at edge_index[1, 33] (a destination), but data.x has 200 rows "
                 "(node ids 0 to 199)"),
    ("rows", "data.x has 190 rows but data.y has 200 entries: one row of features and one label per node"),
])  # fmt: skip
def test_a_bad_field_of_a_pyg_graph_is_one_line_naming_it(fault: str, message: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Each of these ended the command with a 50-line traceback and exit status 1."""
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    path = tmp_path / f"{fault}.pt"
    _bad_pyg_graph(path, fault)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), "--data.init_args.dataset=lightning_zerocopy.datasets.PyGNodeDataset",
              f"--data.init_args.dataset.data={path}", *_QUIET(tmp_path)])  # fmt: skip
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == f"error: {path}: {message}", lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


def test_checkpointing_turned_off_drops_the_recipes_checkpoint_callback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recipe lists a ModelCheckpoint (for last.ckpt); Lightning refuses one with enable_checkpointing=False."""
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    cli = build_cli(["fit", "--config", str(QUICKSTART), *_SMALL, "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
                     "--trainer.enable_checkpointing=false", *_QUIET(tmp_path)])  # fmt: skip
    assert cli.trainer.global_step == 1 and not cli.trainer.checkpoint_callbacks and not list(tmp_path.rglob("*.ckpt"))
