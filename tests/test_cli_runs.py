"""``--ckpt_path last`` means this recipe's last run: each recipe's runs live in ``lightning_logs/<recipe>/``, and a
checkpoint another module class wrote is refused in one line wherever it comes from (``last`` included).

Before: every run went to ``lightning_logs/version_N``; after ``link_prediction.yaml``, ``--config quickstart.yaml
--ckpt_path last`` took the link predictor's ``last.ckpt`` and died in ``load_state_dict`` with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_zerocopy._cli_errors import TRACEBACK_ENV
from lightning_zerocopy.cli import build_cli, main

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
LINK = ROOT / "recipes" / "link_prediction.yaml"

_SHORT = ["--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
          "--trainer.enable_progress_bar=false"]  # fmt: skip
_NODE = ["--data.init_args.dataset.init_args.num_nodes=600", "--data.init_args.batch_size=64"]
_LINKS = ["--data.init_args.dataset.init_args.graph.init_args.num_nodes=600"]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)


def _fit(recipe: Path, small: list[str], tmp_path: Path, *extra: str) -> Path:
    cli = build_cli(["fit", "--config", str(recipe), *small, *_SHORT, f"--trainer.default_root_dir={tmp_path}", *extra])
    return Path(cli.trainer.checkpoint_callback.last_model_path)


def test_each_recipe_keeps_its_runs_and_last_is_its_own(tmp_path: Path) -> None:
    node_last = _fit(QUICKSTART, _NODE, tmp_path)
    link_last = _fit(LINK, _LINKS, tmp_path)  # the newest last.ckpt now is the link predictor's
    assert node_last.parent.parent.parent == tmp_path / "lightning_logs" / "quickstart"
    assert link_last.parent.parent.parent == tmp_path / "lightning_logs" / "link_prediction"
    cli = build_cli(["test", "--config", str(QUICKSTART), *_NODE, *_SHORT, f"--trainer.default_root_dir={tmp_path}",
                     "--ckpt_path=last"])  # fmt: skip
    assert cli.trainer.ckpt_path == str(node_last.resolve())
    assert "test_acc" in cli.trainer.callback_metrics
    # the run's config.yaml names its folder, so a run started from it writes beside it
    (config,) = (tmp_path / "lightning_logs" / "quickstart" / "version_0").glob("config.yaml")
    assert "name: quickstart" in config.read_text()


def test_a_last_checkpoint_of_another_class_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recipe's own logger shared by two recipes (one folder of runs): ``last`` may be another class's."""
    shared = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger",
                         "init_args": {"save_dir": str(tmp_path), "name": "shared"}})  # fmt: skip
    link_last = _fit(LINK, _LINKS, tmp_path, f"--trainer.logger={shared}")
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", str(QUICKSTART), *_NODE, *_SHORT, f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger={shared}", "--ckpt_path=last"])  # fmt: skip
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-2] == (f"error: --ckpt_path last ({link_last.resolve()}) is a checkpoint of "
                         "lightning_zerocopy.models.LinkPredictor, but the recipe's model.class_path is "
                         "lightning_zerocopy.models.GraphSAGE: pass a checkpoint that model wrote, or the recipe the "
                         "checkpoint was trained with"), lines  # fmt: skip
    assert TRACEBACK_ENV in lines[-1] and "Traceback" not in "\n".join(lines)
