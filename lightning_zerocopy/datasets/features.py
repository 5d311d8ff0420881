"""A check that node features hold no NaN or infinity, run once before training.

One NaN feature makes the loss NaN from the first step that samples its node, with no word of where it came from.
:func:`check_finite_features` scans the table in row chunks (a progress bar shows scans longer than a second;
a memory-mapped table is read once through the page cache) and names the first bad node and column.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from lightning_zerocopy.datasets.base import InputDataError

__all__ = ["NonFiniteFeatureError", "check_finite_features"]

_CHUNK_BYTES = 64 * 1024 * 1024  # feature bytes checked per step (bounds the temporary mask, drives the bar)


class NonFiniteFeatureError(InputDataError):
    """A node feature is NaN or infinite.

    Attributes:
        node: the first node (row) with such a value.
        column: its first such column.
        value: the value (``nan``, ``inf`` or ``-inf``).
    """

    def __init__(self, what: str, node: int, column: int, value: float, opt_out: str) -> None:
        self.node, self.column, self.value = node, column, value
        super().__init__(
            f"{what}: {value} at node {node}, column {column} (the first such value); the loss would be NaN from "
            f"the first step that samples the node. Fix the features, or set {opt_out} to train on them as they are"
        )


def check_finite_features(x: torch.Tensor, what: str, opt_out: str) -> None:
    """Raise if ``x`` ``[num_nodes, num_features]`` holds a NaN or an infinity; integer tables pass as they are.

    Args:
        x: the feature table (may be memory-mapped; read in chunks of about 64 MiB).
        what: how the message names the table, e.g. ``"data.init_args.dataset (OGBNodeDataset) features"``.
        opt_out: the setting that skips this check, named in the message (e.g. ``data.init_args.check_features: false``).

    Raises:
        NonFiniteFeatureError: naming the first bad node (row) and column.
    """
    if not x.is_floating_point() or x.numel() == 0:
        return
    rows = max(1, _CHUNK_BYTES // max(1, x.shape[1] * x.element_size()))
    with tqdm(total=x.shape[0], desc="checking features for NaN/inf", unit="rows", unit_scale=True, delay=1.0, leave=False) as bar:
        for start in range(0, x.shape[0], rows):
            chunk = x[start : start + rows]
            bad = ~torch.isfinite(chunk)
            if bool(bad.any()):
                row, column = (int(v) for v in bad.nonzero()[0])
                value = float(chunk[row, column])
                raise NonFiniteFeatureError(what, start + row, column, value, opt_out)
            bar.update(chunk.shape[0])
