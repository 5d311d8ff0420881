"""What ``LinkPredictor`` and ``HeteroLinkPredictor`` share (``models/link_scorer.py``), each test run on both: the
same hand-built batches in PyG ``LinkNeighborLoader``'s layout, as they are (untyped) and as the one-type
``HeteroData`` batch PyG's hetero loader makes of them (typed, ``helpers.link_batches.as_typed``)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from helpers import BatchList
from helpers.link_batches import (
    EDGE,
    NODE,
    TYPED_FEATURES,
    TYPED_METADATA,
    as_typed,
    eval_batches,
    link_batch,
    planted_graph,
    random_negatives,
    train_batches,
)
from torch_geometric.data import Data, HeteroData

from lightning_zerocopy.models import HeteroLinkPredictor, LinkPredictor
from lightning_zerocopy.models.link_scorer import LinkScorer, num_positives

KINDS = ["untyped", "typed"]
NUM_NODES = 240  # planted_graph's


def _model(kind: str, lr: float = 0.01, **options: Any) -> LinkScorer:
    """``LinkPredictor(8, ...)`` (``options``: its decoder and loss), or ``HeteroLinkPredictor`` on ``as_typed``'s one
    node type (it takes no decoder or loss: dot product, the loss by the batch)."""
    options.setdefault("hidden_channels", 8)
    if kind == "untyped":
        return LinkPredictor(8, optimizer=partial(torch.optim.Adam, lr=lr), **options)
    return HeteroLinkPredictor(TYPED_METADATA, TYPED_FEATURES, {NODE: NUM_NODES}, EDGE, lr=lr, **options)


def _batches(kind: str, batches: list[Data]) -> list[Any]:
    return batches if kind == "untyped" else [as_typed(b) for b in batches]


def _embeddings(model: LinkScorer, batch: Any) -> torch.Tensor:
    """The node embeddings the label indices point into."""
    z = model.embed(batch)
    return z[NODE] if isinstance(batch, HeteroData) else z


def _trainer(steps: int, **kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("log_every_n_steps", 5)
    return pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)  # fmt: skip


@pytest.mark.parametrize("kind,options,mode", [
    ("untyped", {"decoder": "dot", "loss": "bce"}, "binary"), ("untyped", {"decoder": "mlp", "loss": "bce"}, "binary"),
    ("untyped", {"decoder": "dot", "loss": "bpr"}, "triplet"), ("untyped", {"decoder": "mlp", "loss": "margin"}, "triplet"),
    ("typed", {}, "binary"), ("typed", {}, "triplet"),
])  # fmt: skip
def test_trains_to_auroc_well_above_chance(kind: str, options: dict[str, Any], mode: str) -> None:
    torch.manual_seed(0)
    g = planted_graph()
    model = _model(kind, lr=0.02, hidden_channels=16, hits_k=[1, 5], **options)
    val = BatchList(_batches(kind, eval_batches(g, 32, 5, query=True)))
    before = _trainer(0).validate(model, val, verbose=False)[0]
    trainer = _trainer(40)
    trainer.fit(model, BatchList(_batches(kind, train_batches(g, 40, 64, mode))), val)
    assert {"train_auroc", "train_loss"} <= set(trainer.callback_metrics), trainer.callback_metrics
    after = trainer.validate(model, val, verbose=False)[0]
    assert after["val_auroc"] > 0.8 and after["val_auroc"] > before["val_auroc"] + 0.1, (before, after)
    assert after["val_mrr"] > before["val_mrr"]
    assert 0.0 <= after["val_hits@1"] <= after["val_hits@5"] <= 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_shared_pool_reports_pool_hits_not_mrr(kind: str) -> None:
    g = planted_graph()
    out = _trainer(0).validate(_model(kind, hits_k=[3]), BatchList(_batches(kind, eval_batches(g, 16, 4, query=False))),
                               verbose=False)[0]  # fmt: skip
    assert set(out) == {"val_auroc", "val_hits@3"}


@pytest.mark.parametrize("kind", KINDS)
def test_batches_without_batch_size_as_pyg_makes_them(kind: str) -> None:
    g = planted_graph()
    batch = train_batches(g, 1, 8, "binary")[0]
    del batch.batch_size  # PyG's LinkNeighborLoader batches carry input_id but no batch_size
    assert num_positives(batch) == 8
    batch = _batches(kind, [batch])[0]
    model = _model(kind)
    logged: list[tuple[str, Any]] = []
    model.log = lambda name, value, **kwargs: logged.append((name, kwargs["batch_size"]))  # type: ignore[method-assign]
    model.training_step(batch, 0)
    assert logged == [("train_loss", 8), ("train_auroc", 8)]
    trainer = _trainer(2)
    trainer.fit(_model(kind), BatchList([batch, batch]), BatchList(_batches(kind, eval_batches(g, 8, 2, query=False))))
    assert {"train_loss", "val_auroc"} <= set(trainer.callback_metrics)


@pytest.mark.parametrize("kind", KINDS)
def test_a_node_batch_is_refused_naming_link_batches(kind: str) -> None:
    x, edge_index = torch.randn(5, 8), torch.tensor([[0, 1], [1, 2]])
    if kind == "untyped":
        batch: Any = Data(x=x, edge_index=edge_index, batch_size=2)
    else:
        batch = HeteroData()
        batch[NODE].x, batch[NODE].n_id = x, torch.arange(5)
        batch[EDGE].edge_index = edge_index
    with pytest.raises(ValueError, match="needs link batches"):
        _model(kind).validation_step(batch, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_scores_and_losses_of_binary_and_triplet_batches(kind: str) -> None:
    """Binary: a label edge's logit is the dot product of its endpoints' embeddings, the loss BCE on ``edge_label > 0``.
    Triplet: a positive and its negatives scored against the source's embedding, the loss BPR."""
    torch.manual_seed(0)
    g = planted_graph()
    pos = g.edge_index[:, :6]
    model = _model(kind, loss="bpr") if kind == "untyped" else _model(kind)
    binary = _batches(kind, [link_batch(g, pos, random_negatives(g, pos[0], 2))])[0]
    scores, positive = model._binary_scores(binary)
    z = _embeddings(model, binary)
    index = binary.edge_label_index if kind == "untyped" else binary[EDGE].edge_label_index
    assert torch.allclose(scores, (z[index[0]] * z[index[1]]).sum(-1), atol=1e-5)
    assert positive.tolist() == [True] * 6 + [False] * 12
    if kind == "typed":  # the loss follows the batch: BCE here, BPR below
        bce = F.binary_cross_entropy_with_logits(scores, positive.float())
        assert torch.allclose(model.training_step(binary, 0), bce)
    for neg in (torch.randint(0, g.num_nodes, (6,)), torch.randint(0, g.num_nodes, (6, 3))):
        triplet = _batches(kind, [link_batch(g, pos, neg, mode="triplet")])[0]
        p, n = model._triplet_scores(triplet)
        assert p.shape == (6,) and n.shape == (6, neg.numel() // 6)
        fields = triplet if kind == "untyped" else triplet[NODE]
        z = _embeddings(model, triplet)
        assert torch.allclose(n[:, 0], (z[fields.src_index] * z[fields.dst_neg_index.view(6, -1)[:, 0]]).sum(-1), atol=1e-5)
        bpr = model.training_step(triplet, 0)
        assert torch.allclose(bpr, -F.logsigmoid(p.unsqueeze(1) - n).mean())


@pytest.mark.parametrize("kind,keys", [("untyped", {"edge_index", "scores", "logits", "edge_label"}),
                                       ("typed", {"score", "logits"})])  # fmt: skip
def test_predict_step_returns_probabilities_of_the_label_edges(kind: str, keys: set[str]) -> None:
    g = planted_graph()
    pos, neg = g.edge_index[:, :5], random_negatives(g, g.edge_index[0, :5], 2)
    batch = _batches(kind, [link_batch(g, pos, neg)])[0]
    out = _model(kind).predict_step(batch, 0)
    assert set(out) == keys
    probability = out["scores" if kind == "untyped" else "score"]
    assert torch.allclose(probability, torch.sigmoid(out["logits"])) and probability.shape == (15,)
    if kind == "untyped":  # global endpoints and the labels ride along
        assert torch.equal(out["edge_index"], torch.cat([pos, neg], dim=1))
        assert torch.equal(out["edge_label"], batch.edge_label)


@pytest.mark.parametrize("kind", KINDS)
def test_training_figures_are_logged_on_logging_steps_only(kind: str) -> None:
    """A logged tensor is read back to the host: ``train_loss`` and ``train_auroc`` only every ``log_every_n_steps``."""
    g = planted_graph()
    model = _model(kind)
    steps: list[tuple[int, str]] = []
    original = model.log

    def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        steps.append((model.global_step, name))
        original(name, value, *args, **kwargs)

    model.log = log  # type: ignore[method-assign]
    trainer = _trainer(12, log_every_n_steps=5)
    trainer.fit(model, BatchList(_batches(kind, train_batches(g, 12, 16, "binary"))))
    assert steps == [(s, name) for s in (0, 5, 10) for name in ("train_loss", "train_auroc")]
    assert {"train_loss", "train_auroc"} <= set(trainer.callback_metrics)
