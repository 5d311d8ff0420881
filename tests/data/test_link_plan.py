"""LinkBatchPlan and link batches against pure-torch references: endpoints, labels, negatives, layouts, purity, ranks."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.link import TinyLinkGraph

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.data.negatives import NegativeDraws, parse_neg_sampling


def _negatives(mode="binary", ratio=1.0, num_nodes=50, **extra):
    return NegativeDraws(parse_neg_sampling({"mode": mode, **extra}, ratio), num_nodes)


def _edges(num_edges=100, num_nodes=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g)


def _global(item, local):
    """Global ids of local ids (``seed_ids`` is ``n_id[:len(seed_ids)]`` in the built batch)."""
    return item.seed_ids[local]


def test_binary_item_matches_a_pure_torch_reference():
    pos = _edges()
    negatives = _negatives(ratio=1.5)
    plan = LinkBatchPlan(pos, 16, num_nodes=50, negatives=negatives, shuffle=True, seed=3)
    item = plan.item(epoch=2, step=1)
    b = 16
    positions = item.input_id
    # reference: positives of the batch, then ceil(1.5 * B) negatives keyed by (batch seed, position)
    n = math.ceil(1.5 * b)
    ref_src = torch.cat([pos[0, positions], negatives.draw(n, item.batch_seed, 0)])
    ref_dst = torch.cat([pos[1, positions], negatives.draw(n, item.batch_seed, 1)])
    eli = item.link_fields["edge_label_index"]
    assert eli.shape == (2, b + n) and eli.dtype == torch.int64
    assert torch.equal(_global(item, eli[0]), ref_src) and torch.equal(_global(item, eli[1]), ref_dst)
    assert torch.equal(item.seed_ids, torch.cat([ref_src, ref_dst]).unique())  # sorted unique endpoints, as PyG
    label = item.link_fields["edge_label"]
    assert label.dtype == torch.float32 and torch.equal(label, torch.cat([torch.ones(b), torch.zeros(n)]))
    assert item.num_positives == b and item.batch_size == item.seed_ids.numel()


@pytest.mark.parametrize("amount", [1, 3])
def test_triplet_item_shapes_and_ids(amount):
    pos = _edges()
    negatives = _negatives("triplet", amount=amount)
    item = LinkBatchPlan(pos, 8, num_nodes=50, negatives=negatives).item(0, 0)
    f = item.link_fields
    assert set(f) == {"src_index", "dst_pos_index", "dst_neg_index"}
    assert f["src_index"].shape == (8,) and f["dst_pos_index"].shape == (8,)
    assert f["dst_neg_index"].shape == ((8,) if amount == 1 else (8, amount))
    assert torch.equal(_global(item, f["src_index"]), pos[0, :8])
    assert torch.equal(_global(item, f["dst_pos_index"]), pos[1, :8])
    # negative j of positive i is draw i * amount + j, as PyG's view(B, -1)
    ref = negatives.draw(8 * amount, item.batch_seed, 1).view(8, amount).squeeze(-1)
    assert torch.equal(_global(item, f["dst_neg_index"]), ref)


def test_negatives_are_deterministic_and_vary_with_epoch_step_and_rank():
    pos = _edges(400)
    negs = _negatives()

    def draw(**kw):
        plan = LinkBatchPlan(pos, 32, num_nodes=50, negatives=negs, shuffle=True, seed=11, **kw)
        return plan.item(1, 2)

    a, b = draw(), draw()
    assert torch.equal(a.seed_ids, b.seed_ids) and a.batch_seed == b.batch_seed
    assert all(torch.equal(a.link_fields[k], b.link_fields[k]) for k in a.link_fields)
    plan = LinkBatchPlan(pos, 32, num_nodes=50, negatives=negs, shuffle=True, seed=11)
    others = [plan.item(0, 2), plan.item(1, 3), draw(rank=1, world_size=2)]
    tail = a.link_fields["edge_label_index"][:, 32:]
    for other in others:  # different batch seed: different negatives
        assert not torch.equal(_global(other, other.link_fields["edge_label_index"][:, 32:]), _global(a, tail))


def test_plan_is_pure_and_ranks_split_the_edges():
    pos = _edges(203)
    negs = _negatives()
    plans = [LinkBatchPlan(pos, 16, num_nodes=50, negatives=negs, shuffle=True, seed=5, rank=r, world_size=2) for r in (0, 1)]
    assert len(plans[0]) == len(plans[1])
    ids = [torch.cat([p.item(3, s).input_id for s in range(len(p))]) for p in plans]
    assert ids[0].numel() == ids[1].numel() == 102  # equal shares, padded by wrap-around
    assert torch.equal(torch.cat(ids).unique(), torch.arange(203))
    # any order of calls, any fresh plan object: the same item
    later = plans[1].item(3, 4)
    fresh = LinkBatchPlan(pos, 16, num_nodes=50, negatives=negs, shuffle=True, seed=5, rank=1, world_size=2)
    fresh.item(0, 0)
    again = fresh.item(3, 4)
    assert torch.equal(later.seed_ids, again.seed_ids) and later.batch_seed == again.batch_seed


def test_user_labels_are_shifted_as_pyg_does_and_negatives_get_zero():
    pos = _edges(40)
    label = torch.tensor([0.0, 1.0] * 20)
    item = LinkBatchPlan(pos, 10, num_nodes=50, negatives=_negatives(), edge_label=label).item(0, 0)
    assert torch.equal(item.link_fields["edge_label"], torch.cat([label[:10] + 1, torch.zeros(10)]))
    # without negatives nothing is shifted (PyG shifts only for binary negative sampling)
    item = LinkBatchPlan(pos, 10, num_nodes=50, edge_label=label).item(0, 0)
    assert torch.equal(item.link_fields["edge_label"], label[:10])


def test_fixed_negatives_grouped_per_positive_carry_their_query():
    pos = _edges(30)
    k = 4
    neg = _edges(30 * k, seed=9)
    item = LinkBatchPlan(pos, 8, num_nodes=50, negatives=_negatives(), neg_edge_index=neg, neg_per_positive=k).item(0, 1)
    positions = item.input_id
    assert torch.equal(positions, torch.arange(8, 16))
    columns = (positions.view(-1, 1) * k + torch.arange(k)).view(-1)
    eli = item.link_fields["edge_label_index"]
    assert torch.equal(_global(item, eli[:, 8:]), neg[:, columns])  # the stored negatives, no random ones
    assert torch.equal(item.link_fields["edge_label_query"], torch.cat([positions, positions.repeat_interleave(k)]))
    assert torch.equal(item.link_fields["edge_label"], torch.cat([torch.ones(8), torch.zeros(8 * k)]))


def test_a_shared_negative_pool_is_spread_over_the_batches_of_all_ranks_once():
    pos, pool = _edges(50), _edges(37, seed=4)
    seen = []
    for rank in (0, 1):
        plan = LinkBatchPlan(pos, 10, num_nodes=50, neg_edge_index=pool, rank=rank, world_size=2)
        for step in range(len(plan)):
            item = plan.item(0, step)
            assert "edge_label_query" not in item.link_fields
            seen.append(_global(item, item.link_fields["edge_label_index"][:, item.num_positives :]))
    assert torch.equal(torch.cat(seen, 1), pool)  # in order, every pool negative exactly once


def test_weighted_negatives_follow_the_weights():
    weight = torch.zeros(50)
    weight[[3, 7]] = 1.0
    negs = NegativeDraws(parse_neg_sampling({"mode": "binary", "src_weight": weight, "dst_weight": weight}, 1.0), 50)
    item = LinkBatchPlan(_edges(), 32, num_nodes=50, negatives=negs).item(0, 0)
    drawn = _global(item, item.link_fields["edge_label_index"][:, 32:])
    assert set(drawn.unique().tolist()) <= {3, 7}


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: LinkBatchPlan(torch.tensor([[0, 1], [2, 50]]), 4, num_nodes=50), "pos_edge_index holds node id 50"),
        (lambda: LinkBatchPlan(torch.tensor([[0, -1], [2, 3]]), 4, num_nodes=50), "node id -1"),
        (lambda: LinkBatchPlan(torch.empty(2, 0, dtype=torch.int64), 4, num_nodes=50), "empty"),
        (lambda: LinkBatchPlan(_edges(4), 4, num_nodes=50, neg_edge_index=torch.tensor([[0], [99]])), "neg_edge_index"),
        (lambda: LinkBatchPlan(_edges(4), 4, num_nodes=50, negatives=_negatives("triplet"), edge_label=torch.ones(4)), "edge_label"),
        (lambda: parse_neg_sampling("binary", -0.5), "neg_sampling_ratio"),
        (lambda: parse_neg_sampling("tripplet", 1.0), "mode must be one of"),
        (lambda: parse_neg_sampling({"mode": "triplet", "amount": 1.5}, 1.0), "integer"),
        (lambda: parse_neg_sampling({"mode": "binary", "ratio": 2}, 1.0), "unknown key"),
        (lambda: _negatives(dst_weight=torch.ones(3)), "dst_weight must hold one weight per node"),
        (lambda: _negatives(src_weight=torch.zeros(50)), "sums to 0"),
    ],
)
def test_bad_input_names_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_built_batches_hold_the_positives_and_negatives_by_global_id():
    dm = ZeroCopyLinkDataModule(TinyLinkGraph(), num_neighbors=[4, 4], batch_size=32, neg_sampling_ratio=2.0, seed=7)
    dm.setup("fit")
    try:
        plan, builder = dm.plan("train"), dm.builder("train").open(dm.resources)
        item = plan.item(0, 3)
        batch = builder.build_batch(item)
        u = item.seed_ids.numel()
        assert torch.equal(batch.n_id[:u], item.seed_ids) and batch.num_sampled_nodes[0] == u
        pos = dm.link_splits["train"].pos_edge_index
        g = batch.n_id[batch.edge_label_index]
        assert torch.equal(g[:, :32], pos[:, batch.input_id])  # the positives map back to their global ids
        assert g.shape == (2, 32 * 3) and batch.batch_size == 32
        assert torch.equal(batch.x, dm.dataset.load().x[batch.n_id])
        builder.close()
    finally:
        dm.teardown("fit")


def test_split_sampler_seed_keys_the_sample_not_the_random_negatives():
    """``sampler_seed="split"`` (evaluation): one sampler seed for every batch; random negatives still per batch,
    the same ones ``"batch"`` draws."""
    pos, negs = _edges(400), _negatives()
    per_batch = LinkBatchPlan(pos, 32, num_nodes=50, negatives=negs, seed=11)
    per_split = LinkBatchPlan(pos, 32, num_nodes=50, negatives=negs, seed=11, sampler_seed="split")
    assert per_split.sampler_seed == "split" and per_batch.sampler_seed == "batch"
    items = [per_split.item(epoch, step) for epoch, step in ((0, 0), (0, 1), (2, 3))]
    assert len({item.batch_seed for item in items}) == 1
    for (epoch, step), item in zip(((0, 0), (0, 1), (2, 3)), items):
        reference = per_batch.item(epoch, step)
        assert torch.equal(item.seed_ids, reference.seed_ids)
        assert all(torch.equal(item.link_fields[k], reference.link_fields[k]) for k in item.link_fields)


def test_one_rank_plan_draws_the_whole_split_on_another_stream():
    pos = _edges(90)
    train = LinkBatchPlan(pos, 16, num_nodes=50, negatives=_negatives(), shuffle=False, seed=5, rank=1, world_size=2)
    other = train.one_rank_plan(17)
    assert (other.world_size, other.rank, other.stream, other.shuffle) == (1, 0, 17, True)
    assert len(other) == -(-90 // 16) and other.batch_size == train.batch_size
    ids = torch.cat([other.item(0, s).input_id for s in range(len(other))])
    assert torch.equal(ids.sort().values, torch.arange(90))  # every positive once on the one rank
    assert not torch.equal(ids, torch.arange(90))  # shuffled
    item = other.item(1, 2)  # a link item: the positives' endpoints (and their negatives') are its seeds
    pairs = _global(item, item.link_fields["edge_label_index"])
    assert torch.equal(pairs[:, : item.num_positives], pos[:, item.input_id])
    assert (train.world_size, train.stream) == (2, 0)  # the plan it came from is unchanged
    with pytest.raises(ValueError, match="stream must be an int >= 0"):
        train.one_rank_plan(-1)
