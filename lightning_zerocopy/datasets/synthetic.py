"""A deterministic synthetic node-classification graph: power-law degrees, planted classes.

The generator is a Chung-Lu style model (the degree-skewed cousin of R-MAT/Kronecker graphs, but with
exact control over the degree tail and the class structure):

* every node belongs to one of ``num_classes`` planted classes of equal size;
* every node draws a weight from a Zipf law ``(rank + 1) ** -skew``; an edge's endpoints are drawn
  proportionally to these weights, so expected degree follows the weight (``skew = 0`` gives uniform
  degrees, ``0.5``-``0.8`` heavy tails like web and citation graphs);
* with probability ``homophily`` an edge's destination is drawn inside the source's class, otherwise
  anywhere, so classes are denser inside than across and neighbours carry label information;
* features are a class-dependent mean (``feature_signal`` times a random Gaussian vector per class) plus
  unit Gaussian noise, so a model that aggregates neighbours beats one that looks at a node alone;
* node ids are shuffled at the end, so ids carry no free locality (as in a real dataset).

Everything is drawn from seeded ``torch.Generator`` streams in fixed-size chunks, so the same parameters
give bitwise the same graph on every machine; the result is cached on disk under a directory keyed by the
parameters. Generation is vectorised torch: a 10M-node / 200M-edge graph takes a few minutes on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from lightning_zerocopy.datasets.base import CachedNodeDataset, keyed_cache, progress_bar, write_labels_and_splits

#: Edges (or nodes) drawn per chunk; part of the generator's definition, so not a parameter.
_CHUNK = 1 << 22
_FEATURE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
#: Node types at least this large are searched with sorted values (:func:`_search`).
_SORTED_SEARCH_FROM = 1 << 20


def _stream(seed: int, *labels: int, device: str = "cpu") -> torch.Generator:
    """An independent generator for one stage/chunk of the build, derived from the dataset seed."""
    mixed = seed & 0xFFFFFFFFFFFF
    for label in labels:
        mixed = (mixed * 6364136223846793005 + 1442695040888963407 + label) & 0x7FFFFFFFFFFFFFFF
    return torch.Generator(device=device).manual_seed(mixed)


def _chunks(total: int, size: int = _CHUNK) -> Iterator[tuple[int, int, int]]:
    for i, start in enumerate(range(0, total, size)):
        yield i, start, min(total, start + size)


def _check_draw_args(homophily: float, skew: float, train_fraction: float, val_fraction: float, feature_dtype: str) -> None:
    """The checks of the generators' shared arguments (:class:`SyntheticGraph`, ``SyntheticHeteroGraph``).

    Raises:
        ValueError: ``homophily`` outside ``[0, 1]``, a negative ``skew``, split fractions that are not positive or
            leave no test split, or an unknown ``feature_dtype``.
    """
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew}")
    if not (0 < train_fraction and 0 <= val_fraction and train_fraction + val_fraction < 1):
        raise ValueError(
            f"train_fraction ({train_fraction}) and val_fraction ({val_fraction}) must be positive and sum"
            " to less than 1 (the rest is the test split)"
        )
    if feature_dtype not in _FEATURE_DTYPES:
        raise ValueError(f"feature_dtype must be one of {sorted(_FEATURE_DTYPES)}, got {feature_dtype!r}")


class _TypeSampler:
    """Weighted draws of one node type's (pre-shuffle) ids, anywhere or inside a planted class: the Chung-Lu drawing
    of :class:`SyntheticGraph` (its one type) and of ``SyntheticHeteroGraph`` (each type).

    Every id draws a weight ``(rank + 1) ** -skew`` at a random rank (``generator``); the classes own equal contiguous
    ranges of the ids.
    """

    def __init__(self, count: int, num_classes: int, skew: float, generator: torch.Generator) -> None:
        self.count = count
        self.bounds = torch.arange(num_classes + 1, dtype=torch.int64) * count // num_classes
        rank = torch.randperm(count, generator=generator)
        weight = (rank.to(torch.float64) + 1.0).pow_(-skew)
        del rank
        self.cdf = torch.cumsum(weight, 0)
        del weight
        self.cdf0 = torch.cat([self.cdf.new_zeros(1), self.cdf])  # cdf0[k] = total weight of ids < k
        self.total = float(self.cdf[-1])

    def to(self, device: torch.device) -> "_TypeSampler":
        """The tables on ``device``, where the draws then happen (the same ids for the same uniform values)."""
        self.bounds, self.cdf, self.cdf0 = self.bounds.to(device), self.cdf.to(device), self.cdf0.to(device)
        return self

    def classes(self) -> torch.Tensor:
        """The planted class of every pre-shuffle id (on the CPU)."""
        bounds = self.bounds.cpu()
        return torch.repeat_interleave(torch.arange(bounds.numel() - 1), bounds.diff())

    def class_of(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.bounds, ids, right=True) - 1

    def draw(
        self, u: torch.Tensor, cls: Optional[torch.Tensor] = None, inside: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Ids for the uniform ``u`` in ``[0, 1)``: by weight over the whole type, or, where ``inside``, by weight
        inside class ``cls`` (a class with no node of this type falls back to the whole type)."""
        lo = torch.zeros_like(u)
        hi = torch.full_like(u, self.total)
        if cls is not None and inside is not None:
            first, last = self.bounds[cls], self.bounds[cls + 1]
            inside = inside & (last > first)
            lo = torch.where(inside, self.cdf0[first], lo)
            hi = torch.where(inside, self.cdf0[last], hi)
        return _search(self.cdf, lo + u * (hi - lo)).clamp_(max=self.count - 1)


def _search(cdf: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``searchsorted(cdf, values, right=True)``; over a ``cdf`` larger than the CPU caches, the values are searched
    in sorted order (the same result, about twice as fast: the binary searches then walk the table in order)."""
    if cdf.numel() < _SORTED_SEARCH_FROM or values.numel() < 2 or cdf.device.type != "cpu":
        return torch.searchsorted(cdf, values, right=True)
    ordered, order = torch.sort(values)
    found = torch.empty_like(order)
    found[order] = torch.searchsorted(cdf, ordered, right=True)
    return found


def _draw_edges(
    source: _TypeSampler, target: _TypeSampler, num_draws: int, homophily: float,
    stream: Callable[[int], torch.Generator], desc: str, device: Any = "cpu", drop_loops: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Pre-shuffle ``(src, dst)`` ids of ``num_draws`` edges (of :class:`SyntheticGraph`, or one generated edge type of
    ``SyntheticHeteroGraph``), chunk ``i`` drawn from ``stream(i)`` on ``device``: a source by ``source``'s weights,
    then with probability ``homophily`` a destination by weight inside its class of ``target``, else anywhere."""
    srcs, dsts = [], []
    with progress_bar(num_draws, desc, "edge") as bar:
        for i, start, stop in _chunks(num_draws):
            gen = stream(i)
            m = stop - start
            src = source.draw(torch.rand(m, generator=gen, dtype=torch.float64, device=device))
            inside = torch.rand(m, generator=gen, device=device) < homophily
            dst = target.draw(torch.rand(m, generator=gen, dtype=torch.float64, device=device), source.class_of(src),
                              inside)
            if drop_loops:  # self-loops
                keep = src != dst
                src, dst = src[keep], dst[keep]
            srcs.append(src.cpu())
            dsts.append(dst.cpu())
            bar.update(m)
    if not srcs:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    return torch.cat(srcs), torch.cat(dsts)


def write_rows_chunked(
    path: Path, rows: int, width: int, dtype: Any, fill: Callable[[int, int], torch.Tensor], desc: str
) -> None:
    """Write a ``[rows, width]`` ``.npy`` of ``dtype`` (a numpy dtype or its name) chunk by chunk (about 4M values
    at a time, with a progress bar): ``fill(start, stop)`` returns rows ``start:stop`` as a tensor."""
    target = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=(rows, width))
    view = torch.from_numpy(target)
    step = max(1, _CHUNK // max(width, 1))
    with progress_bar(rows, desc, "node") as bar:
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            view[start:stop] = fill(start, stop)
            bar.update(stop - start)
    target.flush()
    del view, target


def _write_class_features(
    path: Path,
    classes: torch.Tensor,
    config: dict[str, Any],
    means: torch.Generator,
    noise: Callable[[int], torch.Generator],
    desc: str,
    device: torch.device = torch.device("cpu"),
) -> None:
    """Features of planted classes into ``path``: each class's mean (``feature_signal`` times a Gaussian vector drawn
    from ``means``) plus unit Gaussian noise, drawn on ``device`` row chunk by row chunk (``noise(start)`` is the
    generator of the chunk starting at row ``start``), in ``config``'s ``num_features`` and ``feature_dtype``."""
    width, dtype = config["num_features"], _FEATURE_DTYPES[config["feature_dtype"]]
    centers = (torch.randn(config["num_classes"], width, generator=means) * config["feature_signal"]).to(device)

    def rows(start: int, stop: int) -> torch.Tensor:
        drawn = torch.randn(stop - start, width, generator=noise(start), device=device)
        return drawn.add_(centers[classes[start:stop].to(device)]).to(dtype).cpu()

    write_rows_chunked(path, classes.numel(), width, config["feature_dtype"], rows, desc)


def _split_ids(n: int, train_fraction: float, val_fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """``train_idx``, ``val_idx`` and ``test_idx`` of ``n`` ids: a seeded random permutation cut by the fractions
    (at least one training id), each part sorted."""
    order = torch.randperm(n, generator=_stream(seed, 6))
    n_train = max(1, int(n * train_fraction))
    n_val = int(n * val_fraction)
    parts = {"train_idx": order[:n_train], "val_idx": order[n_train : n_train + n_val], "test_idx": order[n_train + n_val :]}
    return {name: idx.sort().values for name, idx in parts.items()}


def _split_source(call: str, config: dict[str, Any], cache_path: Any) -> str:
    """A split's ``split_source``: the generator ``call`` (its name and node count, unclosed) with the fractions and
    seed that drew the splits, and where it is cached."""
    return (
        f"{call}, train_fraction={config['train_fraction']}, val_fraction={config['val_fraction']}, "
        f"seed={config['seed']}), cached in {cache_path}"
    )


class SyntheticGraph(CachedNodeDataset):
    """A generated power-law graph with planted, learnable classes (see the module docstring).

    Args:
        num_nodes: number of nodes.
        avg_degree: average in-degree of the final graph (self-loops are dropped, so slightly fewer).
        num_features: feature width.
        num_classes: number of planted classes (equal sizes).
        homophily: probability that an edge's destination is drawn inside its source's class, in ``[0, 1]``.
        skew: Zipf exponent of the node weights that set the degrees; ``0`` is uniform, larger is heavier.
        feature_signal: standard deviation of the class means relative to the unit feature noise.
        undirected: store every edge in both directions (then ``avg_degree`` counts both).
        train_fraction: fraction of nodes in the training split.
        val_fraction: fraction of nodes in the validation split; the rest is the test split.
        feature_dtype: ``"float32"`` or ``"float16"``.
        seed: seed of every random draw.
        device: where the edges and features are drawn, e.g. ``"cuda"`` for very large graphs (results are
            deterministic per device type, but a GPU draws different numbers than the CPU).
        cache_dir: cache root (default ``$LIGHTNING_ZEROCOPY_CACHE`` or ``~/.cache/lightning_zerocopy``).
    """

    def __init__(
        self,
        num_nodes: int = 10_000,
        avg_degree: float = 10.0,
        num_features: int = 32,
        num_classes: int = 8,
        homophily: float = 0.8,
        skew: float = 0.6,
        feature_signal: float = 0.25,
        undirected: bool = True,
        train_fraction: float = 0.6,
        val_fraction: float = 0.2,
        feature_dtype: str = "float32",
        seed: int = 0,
        device: str = "cpu",
        cache_dir: Optional[str] = None,
    ) -> None:
        if num_nodes < num_classes or num_classes < 1:
            raise ValueError(f"num_nodes ({num_nodes}) must be >= num_classes ({num_classes}) >= 1")
        if avg_degree <= 0:
            raise ValueError(f"avg_degree must be positive, got {avg_degree}")
        _check_draw_args(homophily, skew, train_fraction, val_fraction, feature_dtype)
        self.config: dict[str, Any] = dict(
            num_nodes=num_nodes,
            avg_degree=avg_degree,
            num_features=num_features,
            num_classes=num_classes,
            homophily=homophily,
            skew=skew,
            feature_signal=feature_signal,
            undirected=undirected,
            train_fraction=train_fraction,
            val_fraction=val_fraction,
            feature_dtype=feature_dtype,
            seed=seed,
            version=1,
        )
        self.device = torch.device(device)
        if self.device.type != "cpu":  # a GPU draws other random numbers: its graphs get their own cache entry
            self.config["device_type"] = self.device.type
        self.cache = keyed_cache(cache_dir, "synthetic", self.config)

    @property
    def num_features(self) -> int:
        return int(self.config["num_features"])

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    def split_source(self, split: str) -> str:
        """The generator call that drew the split (a random permutation cut by the fractions)."""
        return _split_source(f"SyntheticGraph(num_nodes={self.config['num_nodes']}", self.config, self.cache.path)

    # -----------------------------------------------------------------------------------------------------

    def _write(self, out: Path) -> dict[str, Any]:
        cfg = self.config
        n, c, seed = cfg["num_nodes"], cfg["num_classes"], cfg["seed"]
        # Planted classes own contiguous ranges of the pre-shuffle ids; weights are assigned at random ranks.
        nodes = _TypeSampler(n, c, cfg["skew"], _stream(seed, 1)).to(self.device)
        dev = self.device
        src, dst = _draw_edges(nodes, nodes, round(n * cfg["avg_degree"] / (2 if cfg["undirected"] else 1)),
                               cfg["homophily"], lambda i: _stream(seed, 3, i, device=dev.type),
                               "synthetic graph: edges", dev)  # fmt: skip

        new_id = torch.randperm(n, generator=_stream(seed, 2))  # pre-shuffle id -> published id
        y = torch.empty(n, dtype=torch.int64)
        y[new_id] = nodes.classes()
        del nodes
        self._write_edges(out, new_id[src], new_id[dst])
        del src, dst, new_id
        rows = max(1, _CHUNK // max(cfg["num_features"], 1))  # the noise's stream is the chunk's
        _write_class_features(out / "x.npy", y, cfg, _stream(seed, 4),
                              lambda start: _stream(seed, 5, start // rows, device=dev.type),
                              "synthetic graph: features", dev)  # fmt: skip
        write_labels_and_splits(out, y, _split_ids(n, cfg["train_fraction"], cfg["val_fraction"], seed))
        return dict(self.config, num_edges=int(np.load(out / "edge_index.npy", mmap_mode="r").shape[1]))

    def _write_edges(self, out: Path, src: torch.Tensor, dst: torch.Tensor) -> None:
        both = self.config["undirected"]
        num_edges = src.numel() * (2 if both else 1)
        edge_index = np.lib.format.open_memmap(out / "edge_index.npy", mode="w+", dtype=np.int64, shape=(2, num_edges))
        ei = torch.from_numpy(edge_index)
        ei[0, : src.numel()] = src
        ei[1, : src.numel()] = dst
        if both:
            ei[0, src.numel() :] = dst
            ei[1, src.numel() :] = src
        edge_index.flush()
        del ei, edge_index
