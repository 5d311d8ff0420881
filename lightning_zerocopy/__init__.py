"""lightning-zerocopy: zero-copy, pipelined mini-batch GNN training for PyTorch Lightning and PyG.

Importing the package loads the compiled ops (``torch.ops.zerocopy``) and nothing else: no CUDA context,
no daemons, no pinned memory until a Lightning hook asks for them.
"""

from lightning_zerocopy._extension import WITH_CUDA

__version__ = "0.1.0"

__all__ = ["WITH_CUDA", "__version__"]
