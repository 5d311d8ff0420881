"""lightning-zerocopy: zero-copy, pipelined mini-batch GNN training for PyTorch Lightning and PyG.

Importing the package loads the compiled ops (``torch.ops.zerocopy``) and nothing else: no CUDA context,
no daemons, no pinned memory until a Lightning hook asks for them. The public classes below are imported
lazily on first access (``lightning_zerocopy.ZeroCopyDataModule`` imports Lightning and PyG only then).
"""

from __future__ import annotations

from lightning_zerocopy._extension import WITH_CUDA
from lightning_zerocopy._lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "ZeroCopyDataModule": "lightning_zerocopy.data.datamodule",
    "ZeroCopyLinkDataModule": "lightning_zerocopy.data.link_datamodule",
    "ZeroCopyHeteroDataModule": "lightning_zerocopy.data.datamodule",
    "ZeroCopyHeteroLinkDataModule": "lightning_zerocopy.data.link_datamodule",
    "BatchBuilder": "lightning_zerocopy.data.batch",
    "BatchPlan": "lightning_zerocopy.data.plan",
    "PlanItem": "lightning_zerocopy.data.plan",
    "PlanLoader": "lightning_zerocopy.data.loader",
    "SyntheticGraph": "lightning_zerocopy.datasets.synthetic",
    "OGBNodeDataset": "lightning_zerocopy.datasets.ogb",
    "PyGNodeDataset": "lightning_zerocopy.datasets.pyg",
    "ZeroCopyDDPStrategy": "lightning_zerocopy.strategies.zerocopy_ddp",
}

__all__ = ["WITH_CUDA", "__version__", *_LAZY]


__getattr__ = lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(__all__)
