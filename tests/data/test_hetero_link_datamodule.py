"""ZeroCopyHeteroLinkDataModule: PyG hetero LinkNeighborLoader fields checked against the graph, binary and triplet,
fixed negatives, determinism, resume, predict rows, a model that learns, and the one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers.hetero_link import ITEM, RATES, REV_RATES, USER, FaultyHeteroLinks, global_pairs, small_graph
from torch_geometric.data import HeteroData

from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.datasets.link_checks import pair_keys
from lightning_zerocopy.models import HeteroLinkPredictor


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hetero-links")
    small_graph(str(path)).prepare()
    return str(path)


def _dm(cache: str, **kwargs) -> ZeroCopyHeteroLinkDataModule:
    dataset = kwargs.pop("dataset", None) or small_graph(cache)
    kwargs.setdefault("num_neighbors", [4, 3])
    kwargs.setdefault("batch_size", 40)
    kwargs.setdefault("num_threads", 1)
    return ZeroCopyHeteroLinkDataModule(dataset, **kwargs)


def _trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    for key in ("logger", "enable_progress_bar", "enable_model_summary", "enable_checkpointing"):
        kwargs.setdefault(key, False)
    return pl.Trainer(accelerator="cpu", devices=1, default_root_dir=str(tmp_path), **kwargs)


def _check_subgraph(batch: HeteroData, data, node_keyed: bool = False) -> None:
    """Every sampled edge is an edge of its type in the graph (through ``n_id`` and ``e_id``); ``n_id`` unique per type
    (``node_keyed``, evaluation: unique per hop, a node may come again at a later level)."""
    for edge_type in (RATES, REV_RATES):
        store = batch[edge_type]
        local = store.edge_index
        sampled = torch.stack([batch[edge_type[0]].n_id[local[0]], batch[edge_type[2]].n_id[local[1]]])
        assert torch.equal(sampled, data.edge_index[edge_type][:, store.e_id])
        assert sum(store.num_sampled_edges) == local.shape[1]
    for node_type in (USER, ITEM):
        n_id = batch[node_type].n_id
        assert sum(batch[node_type].num_sampled_nodes) == n_id.numel()
        levels = n_id.split(batch[node_type].num_sampled_nodes) if node_keyed else [n_id]
        assert all(level.unique().numel() == level.numel() for level in levels)
        assert torch.equal(batch[node_type].x, data.x[node_type][n_id])


def test_binary_batches_map_back_to_the_graph_and_seed_each_endpoint_type(cache: str) -> None:
    dm = _dm(cache, neg_sampling_ratio=2.0)
    dm.setup("fit")
    try:
        data = dm.dataset.load()
        train = data.splits["train"].pos_edge_index
        batches = list(dm.train_dataloader())
        assert len(batches) == -(-train.shape[1] // 40)
        seen = []
        for batch in batches:
            store = batch[RATES]
            b = store.batch_size
            assert not any("y" in batch[t] for t in (USER, ITEM))
            pairs = global_pairs(batch)
            assert pairs.shape == (2, 3 * b)  # B positives, then ceil(2 B) negatives
            assert torch.equal(pairs[:, :b], train[:, store.input_id])  # each endpoint through its own type's n_id
            assert torch.equal(store.edge_label, torch.cat([torch.ones(b), torch.zeros(2 * b)]))
            assert int(pairs[0].max()) < 300 and int(pairs[1].max()) < 150  # negatives drawn per endpoint type
            # the seeds of each type: its endpoints, unique and sorted, first in n_id (hop 0)
            for row, node_type in ((0, USER), (1, ITEM)):
                seeds = batch[node_type].n_id[: batch[node_type].num_sampled_nodes[0]]
                assert torch.equal(seeds, pairs[row].unique())
            _check_subgraph(batch, data)
            seen.append(store.input_id)
        assert torch.equal(torch.cat(seen).sort().values, torch.arange(train.shape[1]))  # every positive once
    finally:
        dm.teardown("fit")


def test_triplet_batches_put_the_indices_on_the_endpoint_types(cache: str) -> None:
    dm = _dm(cache, neg_sampling={"mode": "triplet", "amount": 3})
    dm.setup("fit")
    try:
        data = dm.dataset.load()
        train = data.splits["train"].pos_edge_index
        batch = next(iter(dm.train_dataloader()))
        users, items, store = batch[USER], batch[ITEM], batch[RATES]
        b = store.batch_size
        assert "edge_label_index" not in store and users.src_index.shape == (b,)
        assert items.dst_pos_index.shape == (b,) and items.dst_neg_index.shape == (b, 3)
        assert torch.equal(users.n_id[users.src_index], train[0, store.input_id])
        assert torch.equal(items.n_id[items.dst_pos_index], train[1, store.input_id])
        assert int(items.dst_neg_index.max()) < items.num_sampled_nodes[0]  # negatives are seeds of the item type
        endpoints = torch.cat([items.n_id[items.dst_pos_index], items.n_id[items.dst_neg_index].view(-1)])
        assert torch.equal(items.n_id[: items.num_sampled_nodes[0]], endpoints.unique())
        _check_subgraph(batch, data)
    finally:
        dm.teardown("fit")


def test_val_batches_score_the_fixed_negatives_of_their_positives(cache: str) -> None:
    dm = _dm(cache, eval_batch_size=16)
    dm.setup("fit")
    try:
        data = dm.dataset.load()
        val = data.splits["val"]
        rated = pair_keys(torch.cat([s.pos_edge_index for s in data.splits.values()], 1)[0],
                          torch.cat([s.pos_edge_index for s in data.splits.values()], 1)[1], 300)  # fmt: skip
        count = 0
        for batch in dm.val_dataloader():
            store = batch[RATES]
            b, ids = store.batch_size, store.input_id
            pairs = global_pairs(batch)
            negatives = val.neg_edge_index.view(2, -1, 5)[:, ids].reshape(2, -1)
            assert torch.equal(pairs, torch.cat([val.pos_edge_index[:, ids], negatives], 1))
            assert torch.equal(store.edge_label_query, torch.cat([ids, ids.repeat_interleave(5)]))
            per_positive = pairs[1, b:].view(b, 5)
            assert all(row.unique().numel() == 5 for row in per_positive)  # distinct negatives per positive
            assert torch.equal(pairs[0, b:], pairs[0, :b].repeat_interleave(5))  # same user
            assert not torch.isin(pair_keys(pairs[0, b:], pairs[1, b:], 300), rated).any()  # never a rating
            _check_subgraph(batch, data, node_keyed=True)
            count += b
        assert count == val.num_positives
    finally:
        dm.teardown("fit")


def test_batches_are_deterministic_and_the_epochs_differ(cache: str) -> None:
    def epoch_batches(epoch: int) -> list[HeteroData]:
        dm = _dm(cache, seed=3)
        dm.setup("fit")
        try:
            loader = dm.train_dataloader()
            loader.set_epoch(epoch)
            return list(loader)
        finally:
            dm.teardown("fit")

    first, again, other = epoch_batches(1), epoch_batches(1), epoch_batches(2)
    for a, b in zip(first, again):
        assert torch.equal(global_pairs(a), global_pairs(b)) and torch.equal(a[USER].n_id, b[USER].n_id)
        assert torch.equal(a[REV_RATES].e_id, b[REV_RATES].e_id) and torch.equal(a[ITEM].x, b[ITEM].x)
    assert not torch.equal(global_pairs(first[0]), global_pairs(other[0]))


def test_a_restored_loader_state_resumes_the_epoch_with_the_same_batches(cache: str) -> None:
    dm = _dm(cache, seed=5)
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        loader.set_epoch(1)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        rest = list(it)
        resumed = dm.train_dataloader()
        resumed.load_state_dict(state)
        again = list(resumed)
        assert len(again) == len(rest) > 0
        for a, b in zip(again, rest):
            assert torch.equal(global_pairs(a), global_pairs(b)) and torch.equal(a[RATES].e_id, b[RATES].e_id)
    finally:
        dm.teardown("fit")


def test_the_reference_model_learns_through_the_trainer(cache: str, tmp_path: Path) -> None:
    pl.seed_everything(0)
    dm = _dm(cache, batch_size=128, num_neighbors=[5, 5])
    model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=16)
    trainer = _trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    auroc = float(trainer.callback_metrics["val_auroc"])
    assert auroc > 0.75, auroc  # chance is 0.5: community features and ratings make the pairs separable
    trainer.test(model, datamodule=dm)
    assert float(trainer.callback_metrics["test_auroc"]) > 0.75


def test_predict_writes_one_row_per_scored_edge_with_the_edge_type(cache: str, tmp_path: Path) -> None:
    dm = _dm(cache, eval_batch_size=32)
    model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, "user__rates__item", hidden_channels=8)
    writer = PredictionWriter(output_dir=str(tmp_path))
    _trainer(tmp_path, callbacks=[writer]).predict(model, datamodule=dm, return_predictions=False)
    rows = np.load(tmp_path / "predictions.npz")
    test = dm.dataset.load().splits["test"]
    assert str(rows["edge_type"]) == "user__rates__item"
    assert rows["src"].shape == (test.num_positives * 6,) and set(rows) >= {"score", "logit", "label", "query"}
    expected = torch.cat([test.pos_edge_index, test.neg_edge_index], 1)
    got = torch.stack([torch.from_numpy(rows["src"]), torch.from_numpy(rows["dst"])])
    key = lambda e: pair_keys(e[0], e[1], 300).sort().values  # noqa: E731
    assert torch.equal(key(got), key(expected))
    assert int(rows["label"].sum()) == test.num_positives and ((rows["score"] > 0) & (rows["score"] < 1)).all()


def test_degree_weighted_negatives_follow_each_endpoint_types_degrees(cache: str) -> None:
    dm = _dm(cache, neg_sampling={"mode": "binary", "amount": 4, "dst_weight": "degree"}, batch_size=200)
    dm.setup("fit")
    try:
        data = dm.dataset.load()
        in_degree = torch.bincount(data.edge_index[RATES][1], minlength=150)
        drawn = torch.cat([global_pairs(b)[1, b[RATES].batch_size :] for b in dm.train_dataloader()])
        assert int(drawn.max()) < 150
        counts = torch.bincount(drawn, minlength=150)
        order = in_degree.argsort()
        assert counts[order[-15:]].sum() > 2 * counts[order[:15]].sum()
    finally:
        dm.teardown("fit")


def test_an_unknown_supervised_edge_type_is_one_line(cache: str) -> None:
    with pytest.raises(ValueError, match=r"^data\.init_args\.dataset \(FaultyHeteroLinks\): the supervised edge type "
                                         r"user__likes__item is not one of the graph's edge types \(user__rates__item, "
                                         r"item__rev_rates__user\)$"):  # fmt: skip
        _dm(cache, dataset=FaultyHeteroLinks(cache, "unknown_type"))


@pytest.mark.parametrize(("fault", "message"), [
    ("src_range", r"the train split \(.*\) holds the 'user' id 300 as the source of pos_edge_index column 7, but "
                  r"'user' has 300 nodes \(ids 0 to 299\)$"),
    ("dst_range", r"the test split \(.*\) holds the 'item' id 150 as the destination of neg_edge_index column 3, but "
                  r"'item' has 150 nodes \(ids 0 to 149\)$"),
])  # fmt: skip
def test_ids_out_of_range_for_their_endpoint_type_are_one_line(cache: str, fault: str, message: str) -> None:
    dm = _dm(cache, dataset=FaultyHeteroLinks(cache, fault))
    with pytest.raises(InputDataError, match=r"^data\.init_args\.dataset \(FaultyHeteroLinks\): " + message) as info:
        dm.setup("fit")
    assert "\n" not in str(info.value)


def test_the_plan_checks_each_endpoint_against_its_own_type() -> None:
    pairs = torch.tensor([[0, 1], [2, 9]])
    with pytest.raises(ValueError, match=r"holds node id 9 \(column 1\), out of range for the destination type 'item' "
                                         r"of 5 nodes \(ids 0 to 4\)$"):  # fmt: skip
        LinkBatchPlan(pairs, 2, num_nodes=10, num_dst_nodes=5, edge_type=RATES)
    plan = LinkBatchPlan(pairs, 2, num_nodes=3, num_dst_nodes=10, edge_type=RATES)  # 9 is a valid item
    item = plan.item(0, 0)
    assert set(item.typed_seeds) == {USER, ITEM}
    assert torch.equal(item.typed_seeds[USER], torch.tensor([0, 1]))
    assert torch.equal(item.typed_seeds[ITEM], torch.tensor([2, 9]))
    # one node type on both ends: the endpoints merge into one seed set, as the homogeneous item does
    same = LinkBatchPlan(pairs, 2, num_nodes=10, num_dst_nodes=10, edge_type=("paper", "cites", "paper")).item(0, 0)
    homogeneous = LinkBatchPlan(pairs, 2, num_nodes=10).item(0, 0)
    assert list(same.typed_seeds) == ["paper"] and torch.equal(same.typed_seeds["paper"], homogeneous.seed_ids)
    assert torch.equal(same.link_fields["edge_label_index"], homogeneous.link_fields["edge_label_index"])
    assert homogeneous.typed_seeds is None


def test_the_reference_model_trains_on_triplet_batches(cache: str, tmp_path: Path) -> None:
    pl.seed_everything(0)
    dm = _dm(cache, neg_sampling={"mode": "triplet", "amount": 2}, batch_size=64)
    model = HeteroLinkPredictor(dm.metadata, dm.num_features, dm.num_nodes, dm.edge_type, hidden_channels=8)
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=2, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["train_loss"]) and "val_auroc" in trainer.callback_metrics


@pytest.mark.filterwarnings("ignore:.*repeated positive edge")
def test_one_node_type_on_both_ends_seeds_that_type_once() -> None:
    from helpers.hetero_link import CitesLinks

    cites = ("paper", "cites", "paper")
    dm = ZeroCopyHeteroLinkDataModule(CitesLinks(), num_neighbors=[3, 2], batch_size=16, num_threads=1)
    dm.setup("fit")
    try:
        data = dm.dataset.load()
        for split in ("train", "val"):
            positives = data.splits[split].pos_edge_index
            for batch in (dm.train_dataloader() if split == "train" else dm.val_dataloader()):
                store, papers = batch[cites], batch["paper"]
                b = store.batch_size
                pairs = global_pairs(batch, cites)
                assert torch.equal(pairs[:, :b], positives[:, store.input_id]) and pairs.shape[1] == 2 * b
                seeds = papers.n_id[: papers.num_sampled_nodes[0]]
                assert torch.equal(seeds, pairs.reshape(-1).unique())  # both endpoints seed the one type, once
                assert batch["author"].num_sampled_nodes[0] == 0 and batch["institution"].num_sampled_nodes[0] == 0
    finally:
        dm.teardown("fit")
