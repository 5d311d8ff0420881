"""``lightning-zerocopy predict ... --data.init_args.predict_mode layerwise``: the command adds
``LayerwisePredictionWriter``, whose ``predictions.npz`` holds the predicted split's exact logits (a full-graph forward of
the checkpoint's model, within 1e-5) for untyped and typed graphs, a link module's run writes its node embeddings, and
bad input is one line (exit status 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from helpers.hetero import PAPER, TinyHeteroDataset
from lightning_zerocopy.cli import main
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE, HeteroNodeClassifier, LinkPredictor

TOL = dict(atol=1e-5, rtol=1e-5)
TRAINER = {"accelerator": "cpu", "devices": 1, "max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 0,
           "enable_progress_bar": False, "enable_model_summary": False, "logger": False,
           "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}]}  # fmt: skip


def _fit(tmp_path: Path, recipe: dict[str, Any]) -> tuple[Path, Path]:
    recipe = {"seed_everything": 0, "trainer": dict(TRAINER, default_root_dir=str(tmp_path / "fit")), **recipe}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path)])
    return path, next((tmp_path / "fit").rglob("last.ckpt"))


def _predict(recipe: Path, ckpt: Path, out: Path, *extra: str) -> None:
    main(["predict", "--config", str(recipe), f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={out}",
          "--data.init_args.predict_mode=layerwise", *extra])  # fmt: skip


def _one_line_exit(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def untyped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("untyped")
    recipe, ckpt = _fit(tmp, {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyDataModule", "init_args": {
            "dataset": {"class_path": "lightning_zerocopy.datasets.SyntheticGraph", "init_args": {
                "num_nodes": 700, "avg_degree": 6, "num_features": 8, "num_classes": 3, "cache_dir": str(tmp / "g")}},
            "fanouts": [4, 4], "batch_size": 64, "num_threads": 1}},
        "model": {"class_path": "lightning_zerocopy.models.GraphSAGE", "init_args": {"hidden_channels": 16,
                                                                                   "num_layers": 3}}})  # fmt: skip
    return tmp, recipe, ckpt


def test_predict_writes_the_exact_logits_of_the_predicted_split_and_a_layers_embeddings(
    untyped_run: tuple[Path, Path, Path]
) -> None:
    tmp, recipe, ckpt = untyped_run
    out = tmp / "layerwise"
    _predict(recipe, ckpt, out, "--data.init_args.layerwise.embeddings=1", "--data.init_args.layerwise.batch_size=64")
    saved = dict(np.load(next(out.rglob("predictions.npz"))))
    model = GraphSAGE.load_from_checkpoint(ckpt).eval()
    dataset = SyntheticGraph(num_nodes=700, avg_degree=6, num_features=8, num_classes=3, cache_dir=str(tmp / "g"))
    data = dataset.load()
    with torch.no_grad():
        full = model(data.x, data.edge_index)
    test = np.sort(data.test_idx.numpy())
    assert set(saved) == {"node_id", "logits", "pred", "prob"}  # as the sampled predict writes it
    assert saved["node_id"].tolist() == test.tolist()
    torch.testing.assert_close(torch.from_numpy(saved["logits"]), full[test], **TOL)
    assert saved["pred"].tolist() == saved["logits"].argmax(1).tolist()
    np.testing.assert_allclose(saved["prob"], torch.from_numpy(saved["logits"]).softmax(1).max(1).values.numpy(), rtol=1e-6)
    embeddings = np.load(next(out.rglob("embeddings.npy")), mmap_mode="r")
    with torch.no_grad():
        hidden = data.x
        for layer in range(2):  # PyG's own per-layer function over the whole graph
            hidden = model.net.inference_per_layer(layer, hidden, data.edge_index, data.num_nodes)
    torch.testing.assert_close(torch.from_numpy(np.array(embeddings)), hidden, **TOL)


def test_a_sampled_fanout_a_second_writer_or_a_gpu_sampler_without_a_gpu_is_one_line(
    untyped_run: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp, recipe, ckpt = untyped_run
    line = _one_line_exit(capsys, ["predict", "--config", str(recipe), f"--ckpt_path={ckpt}",
                                   "--data.init_args.predict_mode=layerwise", "--data.init_args.eval_fanouts=[10,-1]"])  # fmt: skip
    assert "data.init_args.eval_fanouts samples 10 neighbors" in line
    line = _one_line_exit(capsys, ["predict", "--config", str(recipe), f"--ckpt_path={ckpt}",
                                   f"--trainer.default_root_dir={tmp / 'two'}", "--data.init_args.predict_mode=layerwise",
                                   "--trainer.callbacks+=lightning_zerocopy.callbacks.predictions.PredictionWriter"])  # fmt: skip
    assert "replace trainer.callbacks' PredictionWriter (sampled predictions) by" in line
    line = _one_line_exit(capsys, ["predict", "--config", str(recipe), f"--ckpt_path={ckpt}",
                                   f"--trainer.default_root_dir={tmp / 'uva'}", "--data.init_args.predict_mode=layerwise",
                                   "--data.init_args.layerwise.sampler_placement=uva"])  # fmt: skip
    assert "data.init_args.layerwise.sampler_placement='uva' samples on a CUDA GPU, but this run has none" in line


def test_a_module_without_the_contract_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = {"seed_everything": 0, "trainer": dict(TRAINER, default_root_dir=str(tmp_path)),
              "model": {"class_path": "helpers.hetero.HeteroLinear"},
              "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
                  "dataset": {"class_path": "helpers.hetero.TinyHeteroDataset"}, "num_neighbors": [2, 1],
                  "batch_size": 4, "num_threads": 1, "predict_mode": "layerwise"}}}  # fmt: skip
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    line = _one_line_exit(capsys, ["predict", "--config", str(path), "--allow_untrained", "true"])
    assert "helpers.hetero.HeteroLinear cannot run layer-wise" in line and "layerwise_step(layer, block)" in line


def test_a_typed_graph_predicts_the_input_types_nodes(tmp_path: Path) -> None:
    recipe, ckpt = _fit(tmp_path, {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
            "dataset": {"class_path": "helpers.hetero.TinyHeteroDataset"}, "num_neighbors": [3, 3],
            "batch_size": 8, "num_threads": 1, "predict_split": "all"}},
        "model": {"class_path": "lightning_zerocopy.models.HeteroNodeClassifier",
                  "init_args": {"hidden_channels": 8, "num_layers": 2}}})  # fmt: skip
    _predict(recipe, ckpt, tmp_path / "out", "--data.init_args.layerwise.batch_size=6")
    saved = dict(np.load(next((tmp_path / "out").rglob("predictions.npz"))))
    model = HeteroNodeClassifier.load_from_checkpoint(ckpt).eval()
    data = TinyHeteroDataset().load()
    with torch.no_grad():
        full = model.net(data.x, data.edge_index, {t: torch.arange(n) for t, n in data.num_nodes.items()})
    assert str(saved["node_type"]) == PAPER and saved["node_id"].tolist() == list(range(40))
    torch.testing.assert_close(torch.from_numpy(saved["logits"]), full, **TOL)


def test_a_link_module_writes_its_node_embeddings(tmp_path: Path) -> None:
    recipe, ckpt = _fit(tmp_path, {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyLinkDataModule", "init_args": {
            "dataset": {"class_path": "helpers.link.TinyLinkGraph"}, "num_neighbors": [4, 4], "batch_size": 64,
            "num_threads": 1}},
        "model": {"class_path": "lightning_zerocopy.models.LinkPredictor",
                  "init_args": {"hidden_channels": 16, "num_layers": 2}}})  # fmt: skip
    _predict(recipe, ckpt, tmp_path / "out")
    out = tmp_path / "out"
    assert not list(out.rglob("predictions.npz"))  # a link module's layer-wise output is its embeddings
    saved = np.load(next(out.rglob("embeddings.npy")), mmap_mode="r")
    from helpers.link import TinyLinkGraph

    data = TinyLinkGraph().load()
    model = LinkPredictor.load_from_checkpoint(ckpt).eval()
    with torch.no_grad():
        full = model.encoder(data.x, data.edge_index)
    torch.testing.assert_close(torch.from_numpy(np.array(saved)), full, **TOL)


def test_a_users_basic_gnn_module_runs_unchanged(tmp_path: Path) -> None:
    """A LightningModule holding a PyG BasicGNN (BatchNorm in eval mode) and no layer-wise methods."""
    graph = {"class_path": "lightning_zerocopy.datasets.SyntheticGraph", "init_args": {
        "num_nodes": 500, "avg_degree": 6, "num_features": 8, "num_classes": 3, "cache_dir": str(tmp_path / "g")}}  # fmt: skip
    recipe, ckpt = _fit(tmp_path, {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyDataModule", "init_args": {
            "dataset": graph, "fanouts": [4, 4], "batch_size": 64, "num_threads": 1, "predict_split": "all"}},
        "model": {"class_path": "helpers.layerwise_user.UserSAGE"}})  # fmt: skip
    _predict(recipe, ckpt, tmp_path / "out", "--data.init_args.layerwise.batch_size=40")
    saved = dict(np.load(next((tmp_path / "out").rglob("predictions.npz"))))
    from helpers.layerwise_user import UserSAGE

    model = UserSAGE.load_from_checkpoint(ckpt).eval()
    assert float(model.gnn.norms[0].module.running_var.sub(1).abs().max()) > 0  # trained statistics, used per node
    data = SyntheticGraph(**graph["init_args"]).load()
    with torch.no_grad():
        full = model(data.x, data.edge_index)
    assert saved["node_id"].tolist() == list(range(500))
    torch.testing.assert_close(torch.from_numpy(saved["logits"]), full, **TOL)


def test_an_embeddings_path_that_cannot_hold_them_is_one_line(untyped_run: tuple[Path, Path, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    tmp, recipe, ckpt = untyped_run
    folder = tmp / "a-folder.npy"
    folder.mkdir()
    line = _one_line_exit(capsys, ["predict", "--config", str(recipe), f"--ckpt_path={ckpt}",
                                   f"--trainer.default_root_dir={tmp / 'emb'}", "--data.init_args.predict_mode=layerwise",
                                   "--data.init_args.layerwise.embeddings=0",
                                   f"--data.init_args.layerwise.embeddings_path={folder}"])  # fmt: skip
    assert f"data.init_args.layerwise.embeddings_path {folder} must name a .npy file" in line
