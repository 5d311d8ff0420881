"""Clique grouping from peer-access matrices and the cache_policy decision."""

from __future__ import annotations

import warnings

import pytest

from lightning_zerocopy.cache.cliques import choose_layout, find_cliques

T, F = True, False


def full(n: int) -> list[list[bool]]:
    return [[True] * n for _ in range(n)]


def blocks(*sizes: int) -> list[list[bool]]:
    n = sum(sizes)
    m = [[i == j for j in range(n)] for i in range(n)]
    start = 0
    for size in sizes:
        for i in range(start, start + size):
            for j in range(start, start + size):
                m[i][j] = True
        start += size
    return m


def test_all_connected_is_one_clique() -> None:
    assert find_cliques(full(8)) == [list(range(8))]


def test_two_islands_of_four() -> None:
    assert find_cliques(blocks(4, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_interleaved_islands_are_found_not_assumed() -> None:
    # even GPUs see each other, odd GPUs see each other (a layout a fixed [[0..3],[4..7]] split gets wrong)
    m = [[(i % 2) == (j % 2) for j in range(8)] for i in range(8)]
    assert find_cliques(m) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_one_way_access_is_no_link() -> None:
    m = [[T, T], [F, T]]
    assert find_cliques(m) == [[0], [1]]


def test_largest_clique_first_and_deterministic() -> None:
    # 0-1 linked; 2-3-4 all linked; 1-2 linked
    m = [[i == j for j in range(5)] for i in range(5)]
    for a, b in [(0, 1), (2, 3), (2, 4), (3, 4), (1, 2)]:
        m[a][b] = m[b][a] = True
    assert find_cliques(m) == [[2, 3, 4], [0, 1]]
    assert find_cliques(m) == find_cliques([row[:] for row in m])


def test_greedy_above_the_exact_limit_still_partitions() -> None:
    groups = find_cliques(blocks(9, 9))
    assert sorted(sum(groups, [])) == list(range(18))
    assert groups == [list(range(9)), list(range(9, 18))]


def test_non_square_matrix() -> None:
    with pytest.raises(ValueError, match="square"):
        find_cliques([[T, T], [T]])


def test_replicate_policy() -> None:
    layout = choose_layout("replicate", full(4), hot_rows=100, rows_per_gpu=10)
    assert layout.policy == "replicate" and layout.groups == ((0,), (1,), (2,), (3,))


def test_clique_policy_groups_by_peer_access() -> None:
    layout = choose_layout("clique", blocks(2, 2), hot_rows=100, rows_per_gpu=10)
    assert layout.policy == "clique" and layout.groups == ((0, 1), (2, 3))
    assert layout.group_of(3) == (2, 3)


def test_clique_without_peers_warns_and_replicates() -> None:
    with pytest.warns(UserWarning, match="cache_policy='clique'.*no peer access"):
        layout = choose_layout("clique", blocks(1, 1), hot_rows=100, rows_per_gpu=10)
    assert layout.policy == "replicate"
    with pytest.warns(UserWarning, match="one GPU"):
        assert choose_layout("clique", full(1), 100, 10).policy == "replicate"


def test_auto_picks_clique_only_where_peers_exist_and_the_hot_set_does_not_fit() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fits = choose_layout("auto", full(4), hot_rows=10, rows_per_gpu=10)
        assert fits.policy == "replicate" and "fit one GPU" in fits.note
        big = choose_layout("auto", full(4), hot_rows=11, rows_per_gpu=10)
        assert big.policy == "clique" and big.groups == ((0, 1, 2, 3),)
        lonely = choose_layout("auto", blocks(1, 1), hot_rows=100, rows_per_gpu=10)
        assert lonely.policy == "replicate" and "no peer access" in lonely.note
        one = choose_layout("auto", full(1), hot_rows=100, rows_per_gpu=10)
        assert one.policy == "replicate" and "one GPU" in one.note


def test_unknown_policy_names_the_key() -> None:
    with pytest.raises(ValueError, match="cache_policy"):
        choose_layout("shard", full(2), 1, 1)
