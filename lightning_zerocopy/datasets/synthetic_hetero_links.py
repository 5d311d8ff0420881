"""A generated user–item graph with planted communities, for link prediction on ``user__rates__item``.

Node types ``user`` and ``item``; edge types ``user__rates__item`` (the supervised type) and, with
``add_reverse_edges`` (default), ``item__rev_rates__user`` (PyG's ``ToUndirected`` reverse type), so messages reach
both endpoint types.

* every user and every item belongs to one of ``communities`` planted communities (ids shuffled per type);
* each user rates ``avg_ratings`` items on average (a Poisson-free draw: ``num_users * avg_ratings`` ratings, each by
  a uniform user); with probability ``homophily`` the item is drawn inside the user's community, else anywhere; a pair
  drawn twice is one rating;
* features (both types unless ``featured_types`` says otherwise) are the community's mean (``feature_signal`` times a
  Gaussian vector per type and community) plus unit Gaussian noise, so a user–item pair of one community is
  recognisable from the features alone and better still through the neighbourhood: link prediction is learnable.

Splits (as :class:`~lightning_zerocopy.datasets.synthetic_links.SyntheticLinkGraph` makes them): the distinct ratings
are permuted with the seed, the first ``val_fraction`` are the val positives, the next ``test_fraction`` the test
positives, and both are removed from the message-passing graph, in both edge types (nothing leaks); the rest are the
train positives (all of them still message-passing edges). Each val/test positive gets ``neg_per_positive`` distinct
fixed negatives: the same user, items the user did not rate (so never a positive of any split).

Drawn from seeded ``torch.Generator`` streams: the same parameters give bitwise the same dataset, cached on disk in a
directory keyed by them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from lightning_zerocopy.datasets.base import keyed_cache
from lightning_zerocopy.datasets.hetero import EdgeType, edge_type_str
from lightning_zerocopy.datasets.hetero_cache import typed_graph_entries, write_edge_index, x_name
from lightning_zerocopy.datasets.hetero_links import CachedHeteroLinkDataset
from lightning_zerocopy.datasets.link_checks import PairSet, pair_keys
from lightning_zerocopy.datasets.links import LinkSplit, save_link_split
from lightning_zerocopy.datasets.synthetic import _stream
from lightning_zerocopy.datasets.synthetic_links import check_link_fractions, draw_negatives, hold_out
from lightning_zerocopy.graph.shared_memory import save_npy

__all__ = ["SyntheticHeteroLinkGraph"]

USER, ITEM = "user", "item"
RATES: EdgeType = (USER, "rates", ITEM)
REV_RATES: EdgeType = (ITEM, "rev_rates", USER)


class SyntheticHeteroLinkGraph(CachedHeteroLinkDataset):
    """A user–item rating graph with planted communities, supervised on ``user__rates__item`` (see the module
    docstring).

    Args:
        num_users: ``user`` nodes.
        num_items: ``item`` nodes.
        avg_ratings: ratings drawn per user on average (before repeated pairs are merged).
        communities: planted communities.
        homophily: probability that a rating stays inside the user's community, in ``[0, 1]``.
        num_features: feature width of every featured type.
        featured_types: node types with features (``user`` and ``item`` by default; a featureless type is embedded
            from ``n_id`` by the model).
        feature_signal: standard deviation of the community means relative to the unit feature noise.
        add_reverse_edges: add ``item__rev_rates__user``.
        val_fraction, test_fraction: shares of the distinct ratings held out as val / test positives.
        neg_per_positive: fixed negatives per val/test positive (grouped per positive: MRR).
        seed: seed of every draw.
        cache_dir: cache root (default ``$LIGHTNING_ZEROCOPY_CACHE`` or ``~/.cache/lightning_zerocopy``).
    """

    def __init__(
        self,
        num_users: int = 2000,
        num_items: int = 1000,
        avg_ratings: float = 10.0,
        communities: int = 8,
        homophily: float = 0.9,
        num_features: int = 16,
        featured_types: Sequence[str] = (USER, ITEM),
        feature_signal: float = 1.0,
        add_reverse_edges: bool = True,
        val_fraction: float = 0.05,
        test_fraction: float = 0.1,
        neg_per_positive: int = 10,
        seed: int = 0,
        cache_dir: Optional[str] = None,
    ) -> None:
        if num_users < communities or num_items < communities or communities < 1:
            raise ValueError(f"num_users ({num_users}) and num_items ({num_items}) must be >= communities "
                             f"({communities}) >= 1")  # fmt: skip
        if avg_ratings <= 0:
            raise ValueError(f"avg_ratings must be positive, got {avg_ratings}")
        if not 0.0 <= homophily <= 1.0:
            raise ValueError(f"homophily must be in [0, 1], got {homophily}")
        check_link_fractions(val_fraction, test_fraction, neg_per_positive)
        if neg_per_positive >= num_items:
            raise ValueError(f"neg_per_positive must be in [1, num_items), got {neg_per_positive}")
        unknown = [t for t in featured_types if t not in (USER, ITEM)]
        if unknown:
            raise ValueError(f"featured_types must name some of {[USER, ITEM]}, got {list(featured_types)}")
        self.config: dict[str, Any] = dict(
            num_nodes={USER: int(num_users), ITEM: int(num_items)}, avg_ratings=float(avg_ratings),
            communities=int(communities), homophily=float(homophily), num_features=int(num_features),
            featured_types=[t for t in (USER, ITEM) if t in featured_types], feature_signal=float(feature_signal),
            add_reverse_edges=bool(add_reverse_edges), val_fraction=val_fraction, test_fraction=test_fraction,
            neg_per_positive=int(neg_per_positive), seed=int(seed), version=1,
        )  # fmt: skip
        self.cache = keyed_cache(cache_dir, "synthetic-hetero-links", self.config)

    # cheap shape properties -----------------------------------------------------------------------------------

    @property
    def node_types(self) -> list[str]:
        return [USER, ITEM]

    @property
    def edge_types(self) -> list[EdgeType]:
        return [RATES, REV_RATES] if self.config["add_reverse_edges"] else [RATES]

    @property
    def num_nodes(self) -> dict[str, int]:
        return dict(self.config["num_nodes"])

    @property
    def num_features(self) -> dict[str, int]:
        return {t: self.config["num_features"] for t in self.config["featured_types"]}

    @property
    def edge_type(self) -> EdgeType:
        return RATES

    def split_source(self, split: str) -> str:
        cfg = self.config
        return (f"the {split} ratings of SyntheticHeteroLinkGraph(val_fraction={cfg['val_fraction']}, test_fraction="
                f"{cfg['test_fraction']}, seed={cfg['seed']}), cached in {self.cache.path}")  # fmt: skip

    # the build ---------------------------------------------------------------------------------------------

    def _write(self, out: Path) -> dict[str, Any]:
        cfg = self.config
        seed, c = cfg["seed"], cfg["communities"]
        users, items = cfg["num_nodes"][USER], cfg["num_nodes"][ITEM]
        user_class = torch.randperm(users, generator=_stream(seed, 201)) % c
        item_class = torch.randperm(items, generator=_stream(seed, 202)) % c
        items_of = [torch.nonzero(item_class == k).view(-1) for k in range(c)]
        gen = _stream(seed, 203)
        m = round(users * cfg["avg_ratings"])
        src = torch.randint(users, (m,), generator=gen)
        inside = torch.rand(m, generator=gen) < cfg["homophily"]
        dst = torch.randint(items, (m,), generator=gen)
        for k in range(c):  # inside the user's community: a uniform item of that community
            pick = (inside & (user_class[src] == k)).nonzero().view(-1)
            members = items_of[k]
            dst[pick] = members[torch.randint(members.numel(), (pick.numel(),), generator=gen)]
        n = max(users, items)  # one key space for typed pairs
        keys = pair_keys(src, dst, n).unique()  # sorted distinct ratings
        held = hold_out(keys.numel(), cfg["val_fraction"], cfg["test_fraction"], _stream(seed, 204))
        train = held["train"].sort().values
        rates = torch.stack([keys[train] // n, keys[train] % n])
        write_edge_index(out, RATES, rates)
        if cfg["add_reverse_edges"]:
            write_edge_index(out, REV_RATES, rates.flip(0))
        splits = {"train": save_link_split(out, "train", LinkSplit(pos_edge_index=rates.contiguous()))}
        rated = PairSet(keys)
        for index, name in enumerate(("val", "test")):
            chosen = keys[held[name].sort().values]
            pos = torch.stack([chosen // n, chosen % n])
            neg = self._negatives(pos[0], rated, n, items, _stream(seed, 205, index))
            split = LinkSplit(pos_edge_index=pos, neg_edge_index=neg, neg_per_positive=cfg["neg_per_positive"])
            splits[name] = save_link_split(out, name, split)
        classes = {USER: user_class, ITEM: item_class}
        for index, node_type in enumerate(cfg["featured_types"]):
            means = torch.randn(c, cfg["num_features"], generator=_stream(seed, 206, index)) * cfg["feature_signal"]
            noise = torch.randn(classes[node_type].numel(), cfg["num_features"], generator=_stream(seed, 207, index))
            save_npy((noise + means[classes[node_type]]).contiguous(), out / f"{x_name(node_type)}.npy")
        return typed_graph_entries(cfg["num_nodes"], self.edge_types, self.num_features, edge_type=edge_type_str(RATES),
                                   splits=splits, config=dict(cfg))  # fmt: skip

    def _negatives(self, users: torch.Tensor, rated: PairSet, n: int, items: int, gen: torch.Generator) -> torch.Tensor:
        """``K`` distinct items per positive's user that the user did not rate."""
        return draw_negatives(
            users, self.config["neg_per_positive"], items, n, lambda s, d: rated.contains(pair_keys(s, d, n)), gen,
            "could not draw {k} distinct unrated items per positive after {rounds} rounds: some users rated nearly "
            "every item; lower neg_per_positive or avg_ratings",
        )  # fmt: skip
