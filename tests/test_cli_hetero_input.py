"""Bad heterogeneous input through ``lightning-zerocopy fit``: one line naming the type (and the recipe key), exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.hetero import EDGE_TYPES
from lightning_zerocopy._cli_errors import TRACEBACK_ENV
from lightning_zerocopy.cli import main
from lightning_zerocopy.datasets.hetero import edge_type_str

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


def _recipe(tmp_path: Path, fault: str = "none", num_neighbors: Any = (2, 1)) -> Path:
    config = {
        "model": {"class_path": "helpers.hetero.HeteroLinear"},
        "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
            "dataset": {"class_path": "helpers.hetero.FaultyHeteroDataset", "init_args": {"fault": fault}},
            "num_neighbors": num_neighbors if isinstance(num_neighbors, dict) else list(num_neighbors),
            "batch_size": 4, "num_threads": 1}},
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 2, "limit_val_batches": 0, "logger": False,
                    "enable_progress_bar": False, "enable_checkpointing": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path)},
    }  # fmt: skip
    path = tmp_path / f"hetero-{fault}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


_KEY = "data.init_args.dataset (FaultyHeteroDataset)"
_UNKNOWN = {edge_type_str(et): [2, 1] for et in EDGE_TYPES[1:]} | {"paper__writes__author": [2, 1]}
FAULTS = [
    ("none", _UNKNOWN,
     "data.init_args.num_neighbors names the unknown edge type 'paper__writes__author'; the edge types are: "
     "paper__cites__paper, author__writes__paper, paper__rev_writes__author, institution__employs__author"),
    ("missing_type", (2, 1),
     f"{_KEY}: the edge type venue__hosts__paper names the node type 'venue', which is not one of its node types "
     "(paper, author, institution)"),
    ("bad_id", (2, 1),
     f"{_KEY}: edge_index of author__writes__paper holds the 'author' id 60 at [0, 5], but 'author' has 60 nodes "
     "(ids 0 to 59)"),
    ("rows", (2, 1),
     f"{_KEY}: x of node type 'paper' has shape (39, 8), but the type has 40 nodes: one feature row per node is "
     "needed"),
]  # fmt: skip


@pytest.mark.parametrize("fault, num_neighbors, message", FAULTS,
                         ids=["unknown_edge_type", "missing_type", "bad_id", "rows"])  # fmt: skip
def test_bad_hetero_input_is_one_line_naming_the_type(fault: str, num_neighbors: Any, message: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(_recipe(tmp_path, fault, num_neighbors))])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0] == f"error: {message}", lines
    assert len(lines) == 2 and TRACEBACK_ENV in lines[1], lines


def test_the_same_recipe_without_a_fault_fits(tmp_path: Path) -> None:
    main(["fit", "--config", str(_recipe(tmp_path))])  # returns: exit status 0


def test_the_console_command_exits_2_with_one_line(tmp_path: Path) -> None:
    """The command as a user runs it, the helper dataset importable through PYTHONPATH."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    env.pop(TRACEBACK_ENV, None)
    command = [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(_recipe(tmp_path, "bad_id"))]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]  # Lightning's own notices come first
    assert len(errors) == 1 and lines[errors[0]] == f"error: {FAULTS[2][2]}", proc.stderr[-3000:]
    assert lines[errors[0] + 1:] == [lines[-1]] and TRACEBACK_ENV in lines[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
