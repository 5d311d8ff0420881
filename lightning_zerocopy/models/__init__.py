"""Reference LightningModules: examples of a user's PyG model, not special-cased anywhere."""

from lightning_zerocopy.models.gat import GAT
from lightning_zerocopy.models.graphsage import GraphSAGE
from lightning_zerocopy.models.link_metrics import LinkMetrics, PoolHitsAtK
from lightning_zerocopy.models.link_predictor import HeteroLinkPredictor, LinkPredictor
from lightning_zerocopy.models.node_classifier import HeteroNodeClassifier, NodeClassifier
from lightning_zerocopy.models.relational_gnn import HeteroGNN
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
