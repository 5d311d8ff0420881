"""PredictionWriter: what a predict_step may return, the .npz file's contents, and the per-rank merge under DDP."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.callbacks.predictions import PredictionWriter, seed_predictions


def _batch(n_id: list[int], batch_size: int) -> Data:
    return Data(n_id=torch.tensor(n_id), batch_size=batch_size)


def test_seed_predictions_accepts_logits_or_a_dict() -> None:
    batch = _batch([7, 3, 9, 1], batch_size=2)
    logits = torch.arange(8.0).reshape(4, 2)
    ids, rows = seed_predictions(logits, batch)  # all sampled nodes' logits: the seeds' rows are kept
    assert ids.tolist() == [7, 3] and torch.equal(rows, logits[:2])
    ids, rows = seed_predictions({"logits": logits[:2]}, batch)
    assert ids.tolist() == [7, 3] and torch.equal(rows, logits[:2])
    ids, rows = seed_predictions({"n_id": torch.tensor([5]), "logits": logits[:1]}, batch)
    assert ids.tolist() == [5] and torch.equal(rows, logits[:1])


@pytest.mark.parametrize(
    "prediction, match",
    [
        ({"pred": torch.zeros(2)}, "needs 'logits'"),
        ([1, 2], "must return the logits"),
        (torch.zeros(1, 3), "1 rows of logits for 2 seed nodes"),
    ],
)
def test_seed_predictions_rejects_what_it_cannot_write(prediction, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        seed_predictions(prediction, _batch([7, 3, 9], batch_size=2))


def _trainer(tmp_path: Path, rank: int = 0, world: int = 1) -> SimpleNamespace:
    strategy = SimpleNamespace(broadcast=lambda obj, src=0: obj, barrier=lambda name=None: None)
    return SimpleNamespace(log_dir=str(tmp_path), default_root_dir=str(tmp_path), world_size=world, global_rank=rank,
                           strategy=strategy)  # fmt: skip


def _predict(writer: PredictionWriter, trainer: SimpleNamespace, batches: list[tuple[list[int], torch.Tensor]]) -> None:
    writer.on_predict_epoch_start(trainer, None)
    for i, (ids, logits) in enumerate(batches):
        writer.write_on_batch_end(trainer, None, logits, None, _batch(ids, len(ids)), i, 0)
    writer.on_predict_epoch_end(trainer, None)
    writer.teardown(trainer, None, "predict")


def test_writes_ids_logits_class_and_probability(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randn(3, 4, generator=gen), torch.randn(2, 4, generator=gen)
    writer = PredictionWriter()
    _predict(writer, _trainer(tmp_path), [([8, 2, 5], first), ([0, 6], second)])
    assert writer.path == tmp_path / "predictions.npz"
    assert str(writer.path) in capsys.readouterr().out
    saved = dict(np.load(writer.path))
    assert saved["node_id"].tolist() == [0, 2, 5, 6, 8]  # sorted by node id
    logits = torch.cat([first, second])[[3, 1, 2, 4, 0]]
    np.testing.assert_allclose(saved["logits"], logits.numpy())
    assert saved["pred"].tolist() == logits.argmax(1).tolist()
    np.testing.assert_allclose(saved["prob"], logits.softmax(1).max(1).values.numpy(), rtol=1e-6)


def test_ddp_ranks_write_shares_that_rank_zero_merges(tmp_path: Path) -> None:
    """A distributed plan pads the shares by repeating nodes: each node appears once in the merged file."""
    logits = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    rank1 = PredictionWriter()
    _predict(rank1, _trainer(tmp_path, rank=1, world=2), [([4, 1, 0], logits[3:])])
    assert (tmp_path / "predictions.rank1.npz").exists() and rank1.path is None
    rank0 = PredictionWriter()
    _predict(rank0, _trainer(tmp_path, rank=0, world=2), [([2, 3, 4], logits[:3])])
    saved = dict(np.load(tmp_path / "predictions.npz"))
    assert saved["node_id"].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(saved["logits"], logits[[5, 4, 0, 1, 2]].numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.npz"]


def test_filename_must_be_npz() -> None:
    with pytest.raises(ValueError, match=".npz"):
        PredictionWriter(filename="predictions.csv")


@pytest.mark.cuda
def test_gpu_predictions_are_copied_without_synchronizing_and_all_land(tmp_path: Path) -> None:
    """Each batch's rows go to pinned memory without waiting (a predict step queues ahead of the GPU); the file
    still holds every row, bf16 logits included, once the epoch's end waited for the last copy."""
    gen = torch.Generator().manual_seed(2)
    batches = [(list(range(i * 64, (i + 1) * 64)), torch.randn(64, 5, generator=gen)) for i in range(20)]
    writer, trainer = PredictionWriter(), _trainer(tmp_path)
    writer.on_predict_epoch_start(trainer, None)
    for i, (ids, logits) in enumerate(batches):
        batch = Data(n_id=torch.tensor(ids).cuda(), batch_size=len(ids))
        on_gpu = logits.to("cuda", torch.bfloat16)
        torch.cuda._sleep(5_000_000)  # the GPU is busy: a synchronizing copy would wait for it
        torch.cuda.set_sync_debug_mode("error")
        try:
            writer.write_on_batch_end(trainer, None, {"logits": on_gpu}, None, batch, i, 0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    writer.on_predict_epoch_end(trainer, None)
    saved = dict(np.load(writer.path))
    assert saved["node_id"].tolist() == list(range(20 * 64))
    expected = torch.cat([logits.to(torch.bfloat16).float() for _, logits in batches])
    np.testing.assert_array_equal(saved["logits"], expected.numpy())


def test_edge_predictions_map_the_label_edges_to_global_ids() -> None:
    from torch_geometric.data import Data

    from lightning_zerocopy.callbacks.predictions import edge_predictions

    batch = Data(n_id=torch.tensor([10, 20, 30]), edge_label_index=torch.tensor([[0, 2], [1, 0]]),
                 edge_label=torch.tensor([1.0, 0.0]), edge_label_query=torch.tensor([4, 4]))  # fmt: skip
    cols = edge_predictions({"scores": torch.tensor([0.9, 0.1])}, batch)
    assert cols["src"].tolist() == [10, 30] and cols["dst"].tolist() == [20, 10]
    assert cols["label"].tolist() == [1.0, 0.0] and cols["query"].tolist() == [4, 4]
    with pytest.raises(TypeError, match="one score per edge of batch.edge_label_index \\(2 rows"):
        edge_predictions(torch.zeros(3), batch)
    with pytest.raises(TypeError, match="link predictions need 'score'"):
        edge_predictions({"probs": torch.zeros(2)}, batch)
    # a LinkPredictor-style dict: the probability "score" wins over the raw "logits"
    both = edge_predictions({"score": torch.tensor([0.7, 0.2]), "logits": torch.tensor([3.0, -2.0])}, batch)
    assert both["score"].tolist() == pytest.approx([0.7, 0.2])



def test_link_rows_keep_the_logits_beside_the_score_and_whole_labels_as_integers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LinkPredictor returns the probability ("scores") and the logits: ``score`` is the first, ``logit`` the second;
    the batch's 0/1 ``edge_label`` (float, as PyG's) is written as int64."""
    from torch_geometric.data import Data

    batch = Data(n_id=torch.tensor([10, 20, 30]), edge_label_index=torch.tensor([[0, 2, 1], [1, 0, 2]]),
                 edge_label=torch.tensor([1.0, 0.0, 0.0]), edge_label_query=torch.tensor([4, 4, 4]))  # fmt: skip
    logits = torch.tensor([2.0, -1.0, 0.5])
    writer, trainer = PredictionWriter(), _trainer(tmp_path)
    writer.on_predict_epoch_start(trainer, None)
    writer.write_on_batch_end(trainer, None, {"scores": logits.sigmoid(), "logits": logits}, None, batch, 0, 0)
    writer.on_predict_epoch_end(trainer, None)
    assert capsys.readouterr().out == ""  # the line waits for teardown, after the progress bar's last line
    writer.teardown(trainer, None, "predict")
    assert capsys.readouterr().out == f"predictions: 3 scored edges written to {tmp_path / 'predictions.npz'}\n"
    saved = dict(np.load(tmp_path / "predictions.npz"))
    assert saved["src"].tolist() == [10, 20, 30] and saved["dst"].tolist() == [20, 30, 10]  # sorted by (src, dst)
    np.testing.assert_array_equal(saved["logit"], np.array([2.0, 0.5, -1.0], np.float32))
    np.testing.assert_array_equal(saved["score"], torch.tensor([2.0, 0.5, -1.0]).sigmoid().numpy())
    assert saved["label"].dtype == np.int64 and saved["label"].tolist() == [1, 0, 0]


def test_the_merged_file_counts_each_node_once_for_any_number_of_shares(tmp_path: Path) -> None:
    """The line a merge prints names how many nodes the file holds (each once, as saved), for one rank's share and
    for several ranks' (whose evaluation padding may repeat a node)."""
    from lightning_zerocopy.callbacks.predictions import _save_columns

    share = lambda ids: {"node_id": np.array(ids), "logits": np.ones((len(ids), 3), np.float32),  # noqa: E731
                         "node_type": np.asarray("paper")}  # fmt: skip
    _, two = _save_columns(tmp_path / "a.npz", [share([4, 1, 7]), share([2, 7])])
    _, one = _save_columns(tmp_path / "b.npz", [share([3, 5, 9, 11])])
    assert two == "4 'paper' nodes" and one == "4 'paper' nodes"
    assert dict(np.load(tmp_path / "a.npz"))["node_id"].tolist() == [1, 2, 4, 7]


# ---- the destination (issue 38): checked before predicting; a failed write leaves no partial file ------------------


def test_a_folder_where_the_file_goes_is_refused_before_anything_is_predicted(tmp_path: Path) -> None:
    from lightning_zerocopy.options import RunEnvironmentError

    (tmp_path / "predictions.npz").mkdir()
    trainer = SimpleNamespace(**vars(_trainer(tmp_path)), is_global_zero=True)
    with pytest.raises(RunEnvironmentError) as info:
        PredictionWriter().setup(trainer, None, "predict")  # before the first batch: setup
    assert str(info.value) == (f"{tmp_path / 'predictions.npz'} is a folder: the predictions file cannot be written "
                               "there; move it, or set trainer.default_root_dir elsewhere")  # fmt: skip
    (tmp_path / "afile").write_text("x")
    with pytest.raises(RunEnvironmentError, match=r"PredictionWriter's output_dir .*afile is a file, not a folder"):
        PredictionWriter(output_dir=str(tmp_path / "afile")).setup(trainer, None, "predict")


def test_a_write_that_fails_says_so_in_one_line_and_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    import errno

    from lightning_zerocopy.options import RunEnvironmentError

    real_savez = np.savez

    def full_disk(path, **columns):
        real_savez(path, **columns)  # some bytes landed, then the disk was full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    writer = PredictionWriter()
    with pytest.raises(RunEnvironmentError) as info:
        _predict(writer, _trainer(tmp_path), [([8, 2, 5], torch.randn(3, 4))])
    assert str(info.value) == (f"writing the predictions to {tmp_path / 'predictions.npz'} failed (No space left on "
                               "device); nothing was written there")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []
