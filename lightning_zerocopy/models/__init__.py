"""Reference LightningModules: examples of a user's PyG model, not special-cased anywhere."""

from lightning_zerocopy._lazy import lazy_exports
from lightning_zerocopy.models.gat import GAT
from lightning_zerocopy.models.graphsage import GraphSAGE
from lightning_zerocopy.models.link_metrics import LinkMetrics, PoolHitsAtK
from lightning_zerocopy.models.link_predictor import LinkPredictor
from lightning_zerocopy.models.node_classifier import NodeClassifier
from lightning_zerocopy.models.trim import HopCounts, batch_hop_counts, counts_for_layers

__all__ = [
    "GAT",
    "GraphSAGE",
    "HeteroGNN",
    "HeteroLinkPredictor",
    "HeteroNodeClassifier",
    "HopCounts",
    "LinkMetrics",
    "LinkPredictor",
    "NodeClassifier",
    "PoolHitsAtK",
    "batch_hop_counts",
    "counts_for_layers",
]

# imported on first access (the heterogeneous model's module is only loaded by those who use it)
_LAZY = {
    "HeteroGNN": "lightning_zerocopy.models.hetero_classifier",
    "HeteroNodeClassifier": "lightning_zerocopy.models.hetero_classifier",
    "HeteroLinkPredictor": "lightning_zerocopy.models.hetero_link_predictor",
}

__getattr__ = lazy_exports(__name__, _LAZY)
