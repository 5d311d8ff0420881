"""The reference LinkPredictor on hand-built batches in PyG's LinkNeighborLoader layout (binary and triplet): what it
has beyond what it shares with HeteroLinkPredictor (``test_link_scorer.py``), the metrics, trimming, exact scores."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from helpers.link import TinyLinkGraph
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.models import LinkMetrics, LinkPredictor, PoolHitsAtK
from lightning_zerocopy.models.link_predictor import batch_mode, sigmoid_by_value
from helpers.link_batches import link_batch, planted_graph, train_batches


def test_loss_and_batch_mode_must_agree() -> None:
    g = planted_graph()
    with pytest.raises(ValueError, match=r"model.loss='bpr' trains on triplet batches.*data.neg_sampling"):
        LinkPredictor(8, hidden_channels=8, loss="bpr").training_step(train_batches(g, 1, 8, "binary")[0], 0)
    with pytest.raises(ValueError, match=r"model.loss='bce' trains on binary batches.*bpr or margin"):
        LinkPredictor(8, hidden_channels=8, loss="bce").training_step(train_batches(g, 1, 8, "triplet")[0], 0)
    model = LinkPredictor(8, hidden_channels=8, loss="margin")  # checked at setup, before any batch
    model.trainer = SimpleNamespace(datamodule=SimpleNamespace(neg_sampling={"mode": "binary", "amount": 1}))
    with pytest.raises(ValueError, match=r"data.neg_sampling's mode is binary"):
        model.setup("fit")
    model.trainer = SimpleNamespace(datamodule=SimpleNamespace(neg_sampling="triplet"))
    model.setup("fit")


def test_bad_arguments_name_the_key() -> None:
    with pytest.raises(ValueError, match="model.decoder"):
        LinkPredictor(8, decoder="bilinear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model.loss"):
        LinkPredictor(8, loss="hinge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model.hits_k"):
        LinkPredictor(8, hits_k=[0])


def test_margin_loss_of_triplet_batches() -> None:
    g = planted_graph()
    batch = link_batch(g, g.edge_index[:, :6], torch.randint(0, g.num_nodes, (6, 3)), mode="triplet")
    model = LinkPredictor(8, hidden_channels=8, loss="margin", margin=0.5)
    p, n = model._triplet_scores(batch)
    assert torch.allclose(model.training_step(batch, 0), torch.relu(0.5 - (p.unsqueeze(1) - n)).mean())


def test_grouped_metrics_match_a_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    b, k = 7, 4
    metrics = LinkMetrics("val", [1, 3])
    ranks, pos_scores, neg_scores = [], [], []
    for first in (0, b):  # two eval batches: each holds its positives (query ids = input ids) and their negatives
        scores = torch.randn(b + b * k, generator=gen) * 3
        ids = torch.arange(first, first + b)
        metrics.update(scores, torch.arange(b + b * k) < b, torch.cat([ids, ids.repeat_interleave(k)]))
        ranks.append(1 + (scores[b:].view(b, k) > scores[:b, None]).sum(1))  # each positive among its negatives
        pos_scores += scores[:b].tolist()
        neg_scores += scores[b:].tolist()
    rank = torch.cat(ranks)
    assert torch.allclose(metrics.mrr.compute(), (1.0 / rank).mean())
    for cut in (1, 3):
        assert torch.allclose(metrics.query_hits[str(cut)].compute(), (rank <= cut).float().mean())
    pairs = list(itertools.product(pos_scores, neg_scores))
    assert abs(float(metrics.auroc.compute()) - sum(p > n for p, n in pairs) / len(pairs)) < 1e-6


def test_auroc_compares_logits_across_batches_as_they_are() -> None:
    metrics = LinkMetrics("val", [1])
    metrics.update(torch.tensor([0.2, 0.85]), torch.tensor([True, False]), None)  # every logit inside [0, 1]
    metrics.update(torch.tensor([1.5, -3.0]), torch.tensor([True, False]), None)
    # positives {0.2, 1.5} vs negatives {0.85, -3.0}: 3 of the 4 pairs ordered right (a sigmoid applied to the
    # second batch only would make 1.5 -> 0.82 lose to 0.85: 0.5)
    assert float(metrics.auroc.compute()) == pytest.approx(0.75)


def test_pool_hits_at_k_the_ogb_way() -> None:
    metric = PoolHitsAtK(2)
    metric.update(torch.tensor([0.9, 0.8, 0.5]), torch.tensor([True, False, True]))
    metric.update(torch.tensor([0.6, 0.2, 0.1]), torch.tensor([False, True, False]))
    assert float(metric.compute()) == pytest.approx(1 / 3)  # 2nd best negative 0.6: only 0.9 is above it
    few = PoolHitsAtK(5)
    few.update(torch.tensor([0.1, 0.9]), torch.tensor([True, False]))
    assert float(few.compute()) == 1.0  # fewer negatives than K: every positive is a hit (as OGB's evaluator)


def _scores(model: LinkPredictor, batch: Data) -> torch.Tensor:
    if batch_mode(batch) == "triplet":
        pos, neg = model._triplet_scores(batch)
        return torch.cat([pos, neg.flatten()])
    return model._binary_scores(batch)[0]


@pytest.mark.parametrize("neg_sampling,loss", [("binary", "bce"), ("triplet", "bpr")])
@pytest.mark.parametrize("eval_num_neighbors", [[5, 5], [4, 3, 2], [6]])
def test_trimmed_scores_equal_untrimmed_on_link_datamodule_batches(neg_sampling, loss, eval_num_neighbors) -> None:
    """The label edges' endpoints are the seed rows, so trimming each layer to the hops it needs changes no score;
    more hops than layers ([4, 3, 2]) are cut, fewer ([6]) padded. ``trim=False`` runs every layer on every row."""
    torch.manual_seed(0)
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(), num_neighbors=[5, 5], batch_size=64, neg_sampling=neg_sampling,
                                eval_num_neighbors=eval_num_neighbors)  # fmt: skip
    trimmed = LinkPredictor(8, hidden_channels=16, loss=loss).eval()
    untrimmed = LinkPredictor(8, hidden_channels=16, loss=loss, trim=False).eval()
    untrimmed.load_state_dict(trimmed.state_dict())
    dm.setup("fit")
    try:
        train, val = next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))
        with torch.no_grad():
            for batch in (train, val):
                torch.testing.assert_close(_scores(trimmed, batch), _scores(untrimmed, batch))
            # the switch: trimmed, the last layer computes only the seeds and their first hop
            assert trimmed.embed(train).size(0) == sum(train.num_sampled_nodes[:2]) < train.x.size(0)
            assert untrimmed.embed(train).size(0) == train.x.size(0)
            # PyG-style batches without per-hop counts run untrimmed
            del val.num_sampled_nodes, val.num_sampled_edges
            assert trimmed.embed(val).size(0) == val.x.size(0)
            torch.testing.assert_close(_scores(trimmed, val), _scores(untrimmed, val))
    finally:
        dm.teardown("fit")


def test_trim_needs_an_encoder_that_takes_hop_counts() -> None:
    conv = SAGEConv(8, 8)
    with pytest.raises(ValueError, match="model.trim"):
        LinkPredictor(8, hidden_channels=8, encoder=conv)
    model = LinkPredictor(8, hidden_channels=8, encoder=conv, trim=False)
    g = planted_graph()
    batch = train_batches(g, 1, 8, "binary")[0]
    assert model._binary_scores(batch)[0].shape == (16,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sigmoid_by_value_gives_an_element_the_same_bits_at_every_position(dtype: torch.dtype) -> None:
    """torch.sigmoid computes the tail of a CPU tensor with scalar code: an element's last bit depended on where it
    stood (30 of these slices differed from the whole tensor's result)."""
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    whole = sigmoid_by_value(x)
    assert torch.allclose(whole.double(), torch.sigmoid(x.double()), rtol=1e-2)
    for start, count in [(0, 1), (3, 7), (5, 1500), (11, 3000), (0, 4999)]:
        assert torch.equal(sigmoid_by_value(x[start : start + count]), whole[start : start + count]), (start, count)
    singles = torch.stack([sigmoid_by_value(x[i : i + 1])[0] for i in range(300)])
    assert torch.equal(singles, whole[:300])
    assert sigmoid_by_value(x.view(50, 100)).shape == (50, 100)


def test_an_edge_gets_the_same_predicted_score_on_any_rank_count_or_batch_size() -> None:
    """The scores predict writes (probabilities) for the same edges, the ranks simulated one after the other."""
    torch.manual_seed(0)
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(num_nodes=600, num_edges=6000), num_neighbors=[5, 5], batch_size=64,
                                predict_split="test")  # fmt: skip
    model = LinkPredictor(dm.num_features, hidden_channels=16).eval()
    dm.setup()
    runs = []
    try:
        builder = dm.builder("predict").open(dm.resources)
        for eval_batch_size, world_size in [(64, 1), (64, 2), (29, 3)]:
            dm.eval_batch_size = eval_batch_size
            scores: dict[tuple[int, int, int], float] = {}
            with torch.no_grad():
                for rank in range(world_size):
                    plan = dm.plan("predict", rank=rank, world_size=world_size)
                    for step in range(len(plan)):
                        item = plan.item(0, step)
                        batch = builder.build_batch(item)
                        out = model.predict_step(batch, step)
                        keys = zip(*out["edge_index"].tolist(), batch.edge_label_query.tolist())
                        scores.update(zip(keys, out["scores"].tolist()))
            runs.append(scores)
        builder.close()
    finally:
        dm.teardown()
    assert len(runs[0]) > 2000  # the test split's scored edges
    assert runs[1] == runs[0] and runs[2] == runs[0]  # every bit
