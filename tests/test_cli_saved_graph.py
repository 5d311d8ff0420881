"""A saved graph given by path reaches ``torch.load`` and nothing else: the command's parser never opens a data file.

jsonargparse tried a string given for ``Union[HeteroData, Dataset, str]`` as a config file of each class in the union
and read the whole file as text, 40 times for one ``fit`` (minutes for a 6.8 GB graph). Each test below counts the files
jsonargparse reads as text while the recipe is parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers.pyg_user import saved_data, saved_mag_like
from lightning_zerocopy.cli import ZeroCopyCLI, build_cli, main
from lightning_zerocopy.datasets import saved_graph

_TRAINER = {"accelerator": "cpu", "devices": 1, "max_steps": 2, "limit_val_batches": 0, "logger": False,
            "enable_progress_bar": False, "enable_checkpointing": False, "enable_model_summary": False}  # fmt: skip


@pytest.fixture
def text_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file jsonargparse reads as text (config files), in order."""
    import jsonargparse._paths as paths

    reads: list[Path] = []
    read_text = paths.Path.read_text

    def recording(self: Any) -> str:
        reads.append(Path(str(self.absolute)).resolve())
        return read_text(self)

    monkeypatch.setattr(paths.Path, "read_text", recording)
    return reads


class _Parsed(Exception):
    """Raised once the recipe is parsed, before anything is built."""


def _parse_only(monkeypatch: pytest.MonkeyPatch, recipe: Path) -> None:
    def stop(self: Any) -> None:
        raise _Parsed

    monkeypatch.setattr(ZeroCopyCLI, "before_instantiate_classes", stop)
    with pytest.raises(_Parsed):
        build_cli(["fit", "--config", str(recipe)])


def _write(tmp_path: Path, data: dict, model: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"trainer": dict(_TRAINER, default_root_dir=str(tmp_path)), "data": data,
                                    "model": model}))  # fmt: skip
    return path


_SAGE = {"class_path": "lightning_zerocopy.models.GraphSAGE", "init_args": {"hidden_channels": 8}}
_HETERO = {"class_path": "lightning_zerocopy.models.HeteroNodeClassifier", "init_args": {"hidden_channels": 8}}


def _cases(tmp_path: Path) -> dict[str, tuple[dict, dict]]:
    """Every dataset argument that takes a path, each given a file that is not a config."""
    data_file = saved_data(tmp_path / "graph.pt")
    mag_file = saved_mag_like(tmp_path / "mag.pt")
    node = "lightning_zerocopy.ZeroCopyDataModule"
    link = "lightning_zerocopy.ZeroCopyLinkDataModule"
    hetero = "lightning_zerocopy.ZeroCopyHeteroDataModule"

    def module(class_path: str, dataset: str, fanouts: str, **init_args: Any) -> dict:
        return {"class_path": class_path, "init_args": {
            "dataset": {"class_path": f"lightning_zerocopy.datasets.{dataset}", "init_args": init_args},
            fanouts: [2, 2], "batch_size": 8}}  # fmt: skip

    cache = str(data_file)  # a file where a folder is expected: read as a config, it would show here
    return {
        "PyGNodeDataset.data": (module(node, "PyGNodeDataset", "fanouts", data=str(data_file)), _SAGE),
        "PyGLinkDataset.data": (module(link, "PyGLinkDataset", "num_neighbors", data=str(data_file)),
                                {"class_path": "lightning_zerocopy.models.LinkPredictor"}),
        "PyGHeteroDataset.data": (module(hetero, "PyGHeteroDataset", "num_neighbors", data=str(mag_file)), _HETERO),
        "OGBNodeDataset.root": (module(node, "OGBNodeDataset", "fanouts", root=str(data_file), cache_dir=cache), _SAGE),
        "OGBLinkDataset.root": (module(link, "OGBLinkDataset", "num_neighbors", root=str(data_file), cache_dir=cache),
                                {"class_path": "lightning_zerocopy.models.LinkPredictor"}),
        "OGBHeteroNodeDataset.root": (module(hetero, "OGBHeteroNodeDataset", "num_neighbors", root=str(data_file),
                                             cache_dir=cache), _HETERO),  # fmt: skip
        "SyntheticGraph.cache_dir": (module(node, "SyntheticGraph", "fanouts", cache_dir=cache), _SAGE),
    }


@pytest.mark.parametrize("case", ["PyGNodeDataset.data", "PyGLinkDataset.data", "PyGHeteroDataset.data",
                                  "OGBNodeDataset.root", "OGBLinkDataset.root", "OGBHeteroNodeDataset.root",
                                  "SyntheticGraph.cache_dir"])  # fmt: skip
def test_the_parser_reads_no_file_but_the_recipe(case: str, tmp_path: Path, text_reads: list[Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data, model = _cases(tmp_path)[case]
    recipe = _write(tmp_path, data, model)
    _parse_only(monkeypatch, recipe)
    assert text_reads and set(text_reads) == {recipe.resolve()}, text_reads


def test_a_saved_heterodata_trains_unread_by_the_parser(tmp_path: Path, text_reads: list[Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("LZC_TRACEBACK", "1")
    data, model = _cases(tmp_path)["PyGHeteroDataset.data"]
    loads: list[Any] = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(f) or load(f, *a, **k))
    recipe = _write(tmp_path, data, model)
    main(["fit", "--config", str(recipe)])  # returns: trained
    assert set(text_reads) == {recipe.resolve()}, text_reads
    assert len(loads) == 1  # the dataset's one torch.load of the file


class _Bar:
    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0

    def update(self, count: int) -> None:
        self.n += count

    def __enter__(self) -> "_Bar":
        bars.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


bars: list[_Bar] = []


def test_torch_load_of_a_saved_graph_moves_a_byte_progress_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = saved_mag_like(tmp_path / "mag.pt")
    bars.clear()
    monkeypatch.setattr(saved_graph, "progress_bar", _Bar)
    monkeypatch.setattr(saved_graph, "_CHUNK", 4096)  # a paper's features are read in several chunks
    loaded = saved_graph.load_saved_graph(path, "a HeteroData")
    (bar,) = bars
    assert bar.total == path.stat().st_size and bar.unit == "B" and "mag.pt" in bar.desc
    assert 0.9 * bar.total <= bar.n <= bar.total  # each byte read about once, the bar stops at the size
    assert torch.equal(loaded["paper"].x, torch.load(path, weights_only=False)["paper"].x)
