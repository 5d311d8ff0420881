"""The host copy of a heterogeneous link dataset: the typed host copy (:mod:`lightning_zerocopy.data.host.hetero`),
with the link checks in place of the node splits' and the supervision edges as its split tensors.

The graph and features are shared exactly as for node data (one CSC per edge type, a table per featured type);
:func:`~lightning_zerocopy.data.host.hetero.share_hetero_data` shares a
:class:`~lightning_zerocopy.datasets.hetero_links.HeteroLinkData`'s link splits as named tensors
(``"train.pos_edge_index"``...) and records the supervised edge type in the handles (``link_edge_type``);
:func:`~lightning_zerocopy.data.host.links.link_splits` turns the opened tensors back into ``LinkSplit`` s.
"""

from __future__ import annotations

from pytorch_lightning.utilities import rank_zero_warn

from lightning_zerocopy.data.host.hetero import HeteroHostCopyBuilder
from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.datasets.hetero_links import HeteroLinkData, check_hetero_link_splits
from lightning_zerocopy.datasets.splits import SplitError

__all__ = ["HeteroLinkHostCopyBuilder"]


class HeteroLinkHostCopyBuilder(HeteroHostCopyBuilder):
    """:class:`~lightning_zerocopy.data.host.hetero.HeteroHostCopyBuilder` for a
    :class:`~lightning_zerocopy.datasets.hetero_links.HeteroLinkDataset`: the same load, share and unlink, with the
    checks of a link dataset (every edge type's ids, the link splits against their endpoints' types, finite
    features), each error one line prefixed with the dataset's key."""

    def _check(self, data: HeteroLinkData) -> None:  # type: ignore[override]
        if self._checked:
            return
        dataset = f"{self.key} ({type(self.dataset).__name__})"
        if not isinstance(data, HeteroLinkData):
            raise InputDataError(f"{dataset}: load() returned {type(data).__name__}, not a HeteroLinkData")
        try:
            data.check_ids()
        except InputDataError as exc:
            raise InputDataError(f"{dataset}: {exc}") from exc
        sources = {name: self.dataset.split_source(name) for name in data.splits}
        try:
            warnings = check_hetero_link_splits(data, sources)
        except SplitError as exc:
            raise InputDataError(f"{dataset}: {exc}") from exc
        for warning in warnings:
            rank_zero_warn(f"{dataset}: {warning}")
        self._check_features(data, dataset)
        self._checked = True
