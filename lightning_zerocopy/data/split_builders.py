"""``SplitBuilders``: the opened batch builders of one DataModule process, one per split, and their lifetime.

The evaluation splits (``val``, ``test``, ``predict``) share one builder, and it is the training builder itself
when evaluation samples with the training fanouts. Each distinct builder is closed once.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from lightning_zerocopy.data.batch import BatchBuilder
from lightning_zerocopy.data.resources import DeviceResources

__all__ = ["SPLITS", "SplitBuilders"]

SPLITS = ("train", "val", "test", "predict")


class SplitBuilders:
    """Builders bound to one process's :class:`DeviceResources`, by split; empty until :meth:`open`."""

    def __init__(self) -> None:
        self._by_split: dict[str, BatchBuilder] = {}

    def open(self, make: Callable[[str], BatchBuilder], resources: DeviceResources, eval_like_train: bool) -> None:
        """Open ``make("train")`` and, unless ``eval_like_train``, ``make("val")`` for every evaluation split, on
        ``resources`` (nothing is placed on the GPU before the first batch). Closes builders opened before."""
        self.close()
        train = make("train").open(resources, place=False)
        evaluation = train if eval_like_train else make("val").open(resources, place=False)
        self._by_split = {"train": train, "val": evaluation, "test": evaluation, "predict": evaluation}

    def __getitem__(self, split: str) -> BatchBuilder:
        return self._by_split[split]

    def __len__(self) -> int:
        return len(self._by_split)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_split)

    def sampling_stats(self, split: str) -> Optional[Any]:
        """The hybrid sampling stats of ``split``'s builder, or ``None`` (not open, or not hybrid)."""
        builder = self._by_split.get(split)
        return None if builder is None else builder.sampling_stats

    def close(self) -> None:
        """Close every distinct builder once (each unbinds from the resources, which stay open) and forget them."""
        builders, self._by_split = self._by_split, {}
        for builder in {id(b): b for b in builders.values()}.values():
            builder.close()
