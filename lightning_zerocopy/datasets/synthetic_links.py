"""Link prediction on a :class:`~lightning_zerocopy.datasets.SyntheticGraph`: held-out edges and fixed negatives.

The graph comes from the one generator (:class:`SyntheticGraph`, its own cache); this dataset adds a second cache
holding the message-passing graph without the held-out edges and the supervision edges of each split:

* the distinct edges of the generated graph (an undirected graph's two directions count once; repeated draws of a
  pair count once) are permuted with the seed; the first ``val_fraction`` of them are the val positives, the next
  ``test_fraction`` the test positives;
* every copy of a held-out pair is removed from the message-passing graph, both directions where the graph is
  undirected, so nothing leaks;
* the train positives are the remaining distinct edges (one direction per undirected edge, a pair drawn twice once),
  or a seeded ``train_fraction`` share of them;
* each val/test positive gets ``neg_per_positive`` distinct fixed negatives: same source, uniformly drawn destinations
  that are neither the source nor joined to it by any edge of the generated graph (so never a positive of any split).

Link prediction on it is learnable: planted classes make same-class pairs likelier (``homophily``) and the features
carry the class, so neighbourhood-averaged features score true edges well above random pairs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch

from lightning_zerocopy.datasets.base import keyed_cache
from lightning_zerocopy.datasets.link_checks import PairSet, pair_keys, pairs_in
from lightning_zerocopy.datasets.links import CachedLinkDataset, LinkData, LinkSplit, link_data_from_cache, save_link_split
from lightning_zerocopy.datasets.synthetic import SyntheticGraph, _stream
from lightning_zerocopy.graph.shared_memory import save_npy

__all__ = ["SyntheticLinkGraph"]

_REDRAWS = 64  # rounds of redrawing negatives that hit an edge before giving up (a nearly complete graph)


def check_link_fractions(val_fraction: float, test_fraction: float, neg_per_positive: int) -> None:
    """The link generators' shared arguments: a ``ValueError`` naming the one that is out of range."""
    if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be positive and sum to less"
            " than 1 (the rest are the train edges)"
        )
    if neg_per_positive < 1:
        raise ValueError(f"neg_per_positive must be >= 1, got {neg_per_positive}")


def hold_out(count: int, val_fraction: float, test_fraction: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Positions ``val``, ``test`` and ``train`` (the rest) into ``count`` distinct edges: a seeded permutation cut
    by the shares (at least one val and one test edge; a ``ValueError`` where no train edge is left)."""
    order = torch.randperm(count, generator=generator)
    num_val = max(1, round(count * val_fraction))
    num_test = max(1, round(count * test_fraction))
    if num_val + num_test >= count:
        raise ValueError(
            f"the graph has {count:,} distinct edges, too few to hold out {num_val:,} val and {num_test:,}"
            " test edges and keep train edges: lower val_fraction/test_fraction or grow the graph"
        )
    return {"val": order[:num_val], "test": order[num_val : num_val + num_test], "train": order[num_val + num_test :]}


def draw_negatives(
    src: torch.Tensor,
    k: int,
    num_dst: int,
    key_space: int,
    is_edge: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    generator: torch.Generator,
    failure: str,
) -> torch.Tensor:
    """``k`` distinct negatives per source (``[2, len(src) * k]``, grouped per source): uniform destinations below
    ``num_dst``, redrawn where ``is_edge(src, dst)`` or where one repeats an earlier one of its group (pair keys in
    ``key_space``); a ``ValueError`` with ``failure`` where some are still bad after the last round."""
    src = src.repeat_interleave(k)
    dst = torch.randint(num_dst, (src.numel(),), generator=generator)
    for _ in range(_REDRAWS):
        bad = is_edge(src, dst) | _repeated_in_group(dst, k, key_space)
        bad = bad.nonzero().view(-1)
        if bad.numel() == 0:
            return torch.stack([src, dst])
        dst[bad] = torch.randint(num_dst, (bad.numel(),), generator=generator)
    raise ValueError(failure.format(k=k, rounds=_REDRAWS))


class SyntheticLinkGraph(CachedLinkDataset):
    """A :class:`SyntheticGraph` with a share of its edges held out as val/test positives (see the module docstring).

    Args:
        graph: the generated graph (default: ``SyntheticGraph()``); its node splits are not used.
        val_fraction: share of the distinct edges held out as validation positives.
        test_fraction: share of the distinct edges held out as test positives.
        neg_per_positive: fixed negatives drawn per val/test positive (``K``: grouped per positive, for MRR).
        train_fraction: share of the remaining edges used as train positives (all of them stay message-passing edges).
        seed: seed of the hold-out, the train share and the negatives (the graph has its own).
        cache_dir: cache root (default: the graph's).
    """

    def __init__(
        self,
        graph: Optional[SyntheticGraph] = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.1,
        neg_per_positive: int = 10,
        train_fraction: float = 1.0,
        seed: int = 0,
        cache_dir: Optional[str] = None,
    ) -> None:
        check_link_fractions(val_fraction, test_fraction, neg_per_positive)
        if not 0 < train_fraction <= 1:
            raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
        self.graph = graph if graph is not None else SyntheticGraph()
        self.config: dict[str, Any] = dict(
            graph=self.graph.config,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            neg_per_positive=neg_per_positive,
            train_fraction=train_fraction,
            seed=seed,
            version=2,  # 2: a positive's negatives are distinct, the train positives too
        )
        root = cache_dir if cache_dir is not None else self.graph.cache.path.parent
        self.cache = keyed_cache(root, "synthetic-links", self.config)

    @property
    def num_features(self) -> int:
        return self.graph.num_features

    @property
    def undirected(self) -> bool:
        """Whether the graph stores both directions of every edge (then a pair and its reverse are one edge)."""
        return bool(self.graph.config["undirected"])

    def split_source(self, split: str) -> str:
        cfg = self.config
        return (
            f"the {split} edges of SyntheticLinkGraph(val_fraction={cfg['val_fraction']}, test_fraction="
            f"{cfg['test_fraction']}, seed={cfg['seed']}), cached in {self.cache.path}"
        )

    def prepare(self) -> None:
        self.graph.prepare()
        super().prepare()

    def load(self) -> LinkData:
        self.prepare()
        return link_data_from_cache(self.cache, x_cache=self.graph.cache)

    # -----------------------------------------------------------------------------------------------------

    def _write(self, out: Path) -> dict[str, Any]:
        cfg, seed = self.config, self.config["seed"]
        n, undirected = int(self.graph.config["num_nodes"]), self.undirected
        edge_index = self.graph.cache.tensor("edge_index")
        # an undirected graph is stored as the drawn edges followed by their reverses (SyntheticGraph._write_edges)
        drawn = edge_index[:, : edge_index.shape[1] // 2] if undirected else edge_index
        edges = pair_keys(drawn[0], drawn[1], n, undirected).unique()  # sorted distinct edges
        parts = hold_out(edges.numel(), cfg["val_fraction"], cfg["test_fraction"], _stream(seed, 101))
        held = {name: edges[parts[name]] for name in ("val", "test")}
        removed = pairs_in(edge_index, PairSet(torch.cat(list(held.values())).sort().values), n, undirected, "held-out edges")
        save_npy(edge_index[:, ~removed].contiguous(), out / "edge_index.npy")

        train = drawn[:, ~removed[: drawn.shape[1]]]
        train = train[:, _first_copies(pair_keys(train[0], train[1], n, undirected))]  # a pair drawn twice is one edge
        if cfg["train_fraction"] < 1:
            keep = max(1, round(train.shape[1] * cfg["train_fraction"]))
            train = train[:, torch.randperm(train.shape[1], generator=_stream(seed, 102))[:keep].sort().values]
        splits = {"train": save_link_split(out, "train", LinkSplit(pos_edge_index=train.contiguous()))}
        edges = PairSet(edges)
        for label, name in enumerate(("val", "test")):
            pos = self._orient(held[name], n, undirected, _stream(seed, 103, label))
            neg = self._negatives(pos[0], edges, n, undirected, _stream(seed, 104, label))
            split = LinkSplit(pos_edge_index=pos, neg_edge_index=neg, neg_per_positive=cfg["neg_per_positive"])
            splits[name] = save_link_split(out, name, split)
        return dict(cfg, num_nodes=n, num_edges=int((~removed).sum()), splits=splits)

    @staticmethod
    def _orient(keys: torch.Tensor, n: int, undirected: bool, gen: torch.Generator) -> torch.Tensor:
        """Pairs from their keys; an undirected edge gets a random direction (its key holds ``(min, max)``)."""
        pos = torch.stack([keys // n, keys % n])
        if undirected:
            flip = torch.rand(keys.numel(), generator=gen) < 0.5
            pos[:, flip] = pos.flip(0)[:, flip]
        return pos

    def _negatives(
        self, src: torch.Tensor, edges: PairSet, n: int, undirected: bool, gen: torch.Generator
    ) -> torch.Tensor:
        """``K`` distinct negatives per source: uniform destinations that are not the source, not joined to it, and not
        drawn for the same positive before."""
        return draw_negatives(
            src, self.config["neg_per_positive"], n, n,
            lambda s, d: (d == s) | edges.contains(pair_keys(s, d, n, undirected)), gen,
            "could not draw {k} distinct negatives per positive that are not edges after {rounds} rounds: the graph "
            "is nearly complete around some sources; lower neg_per_positive or avg_degree",
        )  # fmt: skip


def _first_copies(keys: torch.Tensor) -> torch.Tensor:
    """Positions of the first copy of every distinct key, in their order."""
    order = torch.argsort(keys, stable=True)
    ordered = keys[order]
    first = torch.ones(keys.numel(), dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return order[first].sort().values


def _repeated_in_group(dst: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """Which entries of ``dst`` (groups of ``k``, one per positive) repeat an earlier entry of their group."""
    keys = torch.arange(dst.numel()) // k * n + dst
    order = torch.argsort(keys, stable=True)  # a group's first copy of a value comes first
    ordered = keys[order]
    repeated = torch.zeros(dst.numel(), dtype=torch.bool)
    repeated[order[1:]] = ordered[1:] == ordered[:-1]
    return repeated
