"""HeteroNeighborSampler: PyG's hetero NeighborLoader semantics over one CSC per edge type."""

from __future__ import annotations

import pytest
import torch

from helpers.hetero import CITES, EDGE_TYPES, EMPLOYS, WRITES, make_hetero_data, reference_hetero_sample
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.sampling.hetero import dedup_by_type, first_appearance, hop_seed
from lightning_zerocopy.sampling.neighbor_sampler import HeteroNeighborSampler

FANOUTS = {CITES: [3, 2], WRITES: [2, 2], EDGE_TYPES[2]: [4, 1], EMPLOYS: [1, 1]}


def _graphs(data):
    return {
        et: CSCGraph.from_edge_index(ei, max(data.num_nodes[et[0]], data.num_nodes[et[2]]))
        for et, ei in data.edge_index.items()
    }


def _sampler(data, fanouts=FANOUTS, **kwargs):
    return HeteroNeighborSampler(_graphs(data), list(data.num_nodes), fanouts, **kwargs)


def _per_hop(sample, et):
    """``(row, col, e_id)`` of each hop of ``et``."""
    counts = sample.num_sampled_edges[et]
    out, start = [], 0
    for count in counts:
        sl = slice(start, start + count)
        out.append((sample.edge_index[et][0, sl], sample.edge_index[et][1, sl], sample.e_id[et][sl]))
        start += count
    return out


def test_first_appearance_keeps_existing_ids_and_orders_new_ones_by_first_pick() -> None:
    new, local = first_appearance(torch.tensor([5, 3]), torch.tensor([7, 3, 9, 7, 5, 1]))
    assert new.tolist() == [7, 9, 1]
    assert local.tolist() == [2, 1, 3, 2, 0, 4]
    new, local = first_appearance(torch.tensor([1]), torch.tensor([], dtype=torch.int64))
    assert new.numel() == 0 and local.numel() == 0


def test_first_appearance_equals_a_dictionary_walk() -> None:
    """Random existing sets and picks (repeats, existing ids picked again, none new) against the plain definition."""
    gen = torch.Generator().manual_seed(3)
    for trial in range(300):
        existing = torch.randperm(40, generator=gen)[: trial % 9]
        candidates = torch.randint(0, 40, (trial % 50,), generator=gen)
        number = {int(v): i for i, v in enumerate(existing)}
        for v in candidates.tolist():
            number.setdefault(v, len(number))
        new, local = first_appearance(existing, candidates)
        assert new.tolist() == list(number)[existing.numel():], trial
        assert local.tolist() == [number[v] for v in candidates.tolist()], trial


@pytest.mark.parametrize("node_keyed", [False, True], ids=["set", "node_keyed"])
def test_one_dedup_over_every_type_equals_one_per_type(node_keyed: bool) -> None:
    """The hop's joint dedup gives each type what its own first_appearance would, bitwise (random hops, types that
    pick nothing, existing ids that reappear, ids that two types share)."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        types = ["a", "b", "c", "d"][: 1 + trial % 4]
        n_id = {t: torch.randperm(50, generator=gen)[: int(torch.randint(0, 12, (1,), generator=gen))] for t in types}
        picked = {t: [(("x", str(k), t), torch.randint(0, 50, (int(torch.randint(0, 30, (1,), generator=gen)),),
                                                      generator=gen)) for k in range(int(torch.randint(0, 3, (1,), generator=gen)))]
                  for t in types}  # fmt: skip
        picked = {t: [(et, ids) for et, ids in parts if ids.numel()] for t, parts in picked.items()}
        joint = dedup_by_type(n_id, picked, node_keyed)
        for t in types:
            if not picked[t]:
                assert t not in joint
                continue
            existing = n_id[t][:0] if node_keyed else n_id[t]
            new, local = first_appearance(existing, torch.cat([ids for _, ids in picked[t]]))
            if node_keyed:
                local = local + n_id[t].numel()
            assert torch.equal(joint[t][0], new) and torch.equal(joint[t][1], local), (trial, t)


def test_fields_dtypes_and_counts() -> None:
    data = make_hetero_data()
    seeds = data.train_idx[:6]
    sample = _sampler(data).sample(seeds, seed=11, input_type="paper")
    assert set(sample.n_id) == set(data.num_nodes) and set(sample.edge_index) == set(EDGE_TYPES)
    assert torch.equal(sample.n_id["paper"][:6], seeds) and sample.batch_size == 6
    for node_type, n_id in sample.n_id.items():
        assert n_id.dtype == torch.int64
        assert n_id.unique().numel() == n_id.numel(), f"{node_type} ids repeat"  # dedupe per type across hops
        assert len(sample.num_sampled_nodes[node_type]) == 3 and sum(sample.num_sampled_nodes[node_type]) == n_id.numel()
    assert sample.num_sampled_nodes["author"][0] == 0
    for et in EDGE_TYPES:
        assert sample.edge_index[et].dtype == torch.int64 and sample.e_id[et].dtype == torch.int64
        assert len(sample.num_sampled_edges[et]) == 2 and sum(sample.num_sampled_edges[et]) == sample.e_id[et].numel()


def test_every_edge_exists_with_its_e_id_and_respects_the_fanout() -> None:
    data = make_hetero_data()
    sample = _sampler(data).sample(data.train_idx[:8], seed=3, input_type="paper")
    for et in EDGE_TYPES:
        src, _, dst = et
        row, col = sample.edge_index[et]
        original = data.edge_index[et][:, sample.e_id[et]]
        assert torch.equal(sample.n_id[src][row], original[0])
        assert torch.equal(sample.n_id[dst][col], original[1])
        degree = torch.bincount(data.edge_index[et][1], minlength=data.num_nodes[dst])
        for hop, (_, hop_col, hop_eid) in enumerate(_per_hop(sample, et)):
            for target in hop_col.unique().tolist():
                picked = hop_eid[hop_col == target]
                node = int(sample.n_id[dst][target])
                assert picked.numel() == min(FANOUTS[et][hop], int(degree[node]))  # without replacement
                assert picked.unique().numel() == picked.numel()


def test_edges_run_from_the_hop_into_the_previous_hops_nodes() -> None:
    data = make_hetero_data()
    sample = _sampler(data).sample(data.train_idx[:8], seed=5, input_type="paper")
    for et in EDGE_TYPES:
        dst = et[2]
        bounds = torch.tensor(sample.num_sampled_nodes[dst]).cumsum(0).tolist()
        for hop, (_, col, _) in enumerate(_per_hop(sample, et)):
            begin = 0 if hop == 0 else bounds[hop - 1]
            assert bool(((col >= begin) & (col < bounds[hop])).all())  # targets: the nodes the previous hop added


def test_same_seed_same_batch_other_seed_other_batch() -> None:
    data = make_hetero_data()
    sampler = _sampler(data)
    a = sampler.sample(data.train_idx[:8], seed=7, input_type="paper")
    b = _sampler(data, num_threads=1).sample(data.train_idx[:8], seed=7, input_type="paper")
    c = sampler.sample(data.train_idx[:8], seed=8, input_type="paper")
    for et in EDGE_TYPES:
        assert torch.equal(a.edge_index[et], b.edge_index[et]) and torch.equal(a.e_id[et], b.e_id[et])
    for t in a.n_id:
        assert torch.equal(a.n_id[t], b.n_id[t])
    assert any(not torch.equal(a.e_id[et], c.e_id[et]) for et in EDGE_TYPES)
    assert hop_seed(7, 0, 1) != hop_seed(7, 1, 0) and hop_seed(7, 0, 1) == hop_seed(7, 0, 1)


def test_matches_a_pure_python_reference_of_pygs_set_semantics() -> None:
    data = make_hetero_data(seed=4)
    seeds = data.train_idx[:7]
    sample = _sampler(data).sample(seeds, seed=21, input_type="paper")
    picks = {}  # (edge type, hop, target id) -> e_ids the kernel drew
    for et in EDGE_TYPES:
        for hop, (_, col, e_id) in enumerate(_per_hop(sample, et)):
            for target_local, e in zip(col.tolist(), e_id.tolist()):
                picks.setdefault((et, hop, int(sample.n_id[et[2]][target_local])), []).append(e)
    n_id, edges = reference_hetero_sample(data, seeds.tolist(), FANOUTS, lambda et, hop, t: picks.get((et, hop, t), []))
    for node_type in data.num_nodes:
        assert sample.n_id[node_type].tolist() == n_id[node_type], node_type
    for et in EDGE_TYPES:
        got = set(zip(sample.edge_index[et][0].tolist(), sample.edge_index[et][1].tolist(), sample.e_id[et].tolist()))
        assert got == edges[et]


def test_all_neighbors_with_minus_one() -> None:
    data = make_hetero_data()
    fanouts = {et: [-1] for et in EDGE_TYPES}
    sample = _sampler(data, fanouts).sample(data.train_idx[:4], seed=0, input_type="paper")
    for et in (CITES, WRITES):
        into_seeds = torch.isin(data.edge_index[et][1], data.train_idx[:4]).sum()
        assert sample.e_id[et].numel() == int(into_seeds)


def test_node_keyed_levels_and_picks_do_not_depend_on_the_batch() -> None:
    data = make_hetero_data()
    sampler = _sampler(data, node_keyed=True)
    big = sampler.sample(data.train_idx[:10], seed=9, input_type="paper")
    small = sampler.sample(data.train_idx[3:4], seed=9, input_type="paper")
    target = int(data.train_idx[3])
    for et in (CITES, WRITES):
        (_, col_b, eid_b), (_, col_s, eid_s) = _per_hop(big, et)[0], _per_hop(small, et)[0]
        mine_b = eid_b[big.n_id["paper"][col_b] == target]
        assert torch.equal(mine_b, eid_s)  # the seed's picks are keyed by its id, not its position
    for et in EDGE_TYPES:  # edges run from level k + 1 to level k
        src, _, dst = et
        src_bounds = [0, *torch.tensor(big.num_sampled_nodes[src]).cumsum(0).tolist()]
        dst_bounds = [0, *torch.tensor(big.num_sampled_nodes[dst]).cumsum(0).tolist()]
        for hop, (row, col, _) in enumerate(_per_hop(big, et)):
            assert bool(((row >= src_bounds[hop + 1]) & (row < src_bounds[hop + 2])).all())
            assert bool(((col >= dst_bounds[hop]) & (col < dst_bounds[hop + 1])).all())


def test_bad_fanouts_are_refused() -> None:
    data = make_hetero_data()
    with pytest.raises(ValueError, match="exactly the edge types"):
        _sampler(data, {CITES: [2]})
    with pytest.raises(ValueError, match="as many fanouts"):
        _sampler(data, {**{et: [2, 2] for et in EDGE_TYPES}, CITES: [2]})
    with pytest.raises(ValueError, match="input_type"):
        _sampler(data).sample(data.train_idx[:2], seed=0, input_type="venue")


def test_with_replacement_every_target_with_neighbors_draws_exactly_its_fanout() -> None:
    data = make_hetero_data()
    sample = _sampler(data, replace=True).sample(data.train_idx[:8], seed=2, input_type="paper")
    for et in EDGE_TYPES:
        dst = et[2]
        degree = torch.bincount(data.edge_index[et][1], minlength=data.num_nodes[dst])
        for hop, (_, col, _) in enumerate(_per_hop(sample, et)):
            counts = torch.bincount(col, minlength=sample.n_id[dst].numel())
            targets = counts.nonzero().flatten()
            assert bool((counts[targets] == FANOUTS[et][hop]).all())
            assert bool((degree[sample.n_id[dst][targets]] > 0).all())
