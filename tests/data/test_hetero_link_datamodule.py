"""What only ZeroCopyHeteroLinkDataModule has: the reference model learning (binary and triplet), negatives weighted by
each endpoint type's degrees, the endpoint-typed plan and errors, one node type on both ends (the batch fields, fixed
negatives, determinism, resume and predict rows are checked for both graph kinds in test_link_datamodule.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.hetero_link import ITEM, RATES, USER, FaultyHeteroLinks, global_pairs, small_graph

from lightning_zerocopy import ZeroCopyHeteroLinkDataModule
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.datasets.base import InputDataError
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
