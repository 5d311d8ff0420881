"""Link-prediction evaluation metrics over fixed negatives: AUROC, MRR and Hits@K (torchmetrics objects).

Two layouts of evaluation negatives (see :class:`~lightning_zerocopy.datasets.LinkSplit`):

* grouped per positive (``neg_per_positive = K``, ``ogbl-citation2`` style): each evaluation batch carries
  ``edge_label_query``, the id of the positive each scored edge belongs to, and the ranking metrics are
  torchmetrics' :class:`~torchmetrics.retrieval.RetrievalMRR` and :class:`~torchmetrics.retrieval.RetrievalHitRate`
  with ``indexes = edge_label_query`` (one query per positive: its score against its own negatives);
* a shared pool (``ogbl-collab`` / ``ogbl-ppa`` style): no ``edge_label_query``; :class:`PoolHitsAtK` keeps every
  positive and negative score of the epoch and counts, at epoch end, the positives scored above the ``K``-th best
  negative of the whole pool (OGB's Hits@K).

AUROC (:class:`~torchmetrics.classification.BinaryAUROC`, exact) is computed over every scored edge in both layouts.
All states are concatenated tensors, so DDP ranks gather them at ``compute`` and updates never synchronize the host.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import BinaryAUROC
from torchmetrics.retrieval import RetrievalHitRate, RetrievalMRR
from torchmetrics.utilities import dim_zero_cat

__all__ = ["LinkMetrics", "PoolHitsAtK"]


class PoolHitsAtK(Metric):
    """Hits@K against a shared pool of negatives, the OGB way.

    A positive is a hit when its score is above the ``K``-th highest negative score of the whole epoch (all
    batches, all ranks); with fewer than ``K`` negatives every positive is a hit (as OGB's evaluator does).

    Args:
        k: the cut-off ``K``.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"Hits@K needs K >= 1, got {k} (model.hits_k)")
        self.k = int(k)
        self.add_state("pos", default=[], dist_reduce_fx="cat")
        self.add_state("neg", default=[], dist_reduce_fx="cat")

    def update(self, scores: torch.Tensor, positive: torch.Tensor) -> None:  # type: ignore[override]
        """``scores`` of the scored edges and ``positive``, a bool mask of the same shape."""
        self.pos.append(scores[positive].detach().float())
        self.neg.append(scores[~positive].detach().float())

    def compute(self) -> torch.Tensor:
        pos, neg = dim_zero_cat(self.pos), dim_zero_cat(self.neg)
        if pos.numel() == 0:
            return torch.tensor(0.0, device=pos.device)
        if neg.numel() < self.k:
            return torch.tensor(1.0, device=pos.device)
        kth = torch.topk(neg, self.k).values[-1]
        return (pos > kth).float().mean()


class LinkMetrics(nn.Module):
    """The evaluation metrics of one stage (``val`` or ``test``), logged as ``<stage>_auroc``, ``<stage>_mrr`` and
    ``<stage>_hits@K`` (:meth:`log_to`).

    Args:
        stage: the name prefix.
        hits_k: the cut-offs ``K`` of Hits@K.
    """

    def __init__(self, stage: str, hits_k: Sequence[int]) -> None:
        super().__init__()
        if not hits_k or any(int(k) < 1 for k in hits_k):
            raise ValueError(f"model.hits_k must list cut-offs >= 1, got {list(hits_k)}")
        self.stage = stage
        self.hits_k = [int(k) for k in hits_k]
        # normalization=None: torchmetrics would otherwise apply a sigmoid per batch, only to batches with a logit
        # outside [0, 1], and compare those with other batches' raw logits
        self.auroc = BinaryAUROC(validate_args=False, normalization=None)
        self.mrr = RetrievalMRR()
        self.query_hits = nn.ModuleDict({str(k): RetrievalHitRate(top_k=k) for k in self.hits_k})
        self.pool_hits = nn.ModuleDict({str(k): PoolHitsAtK(k) for k in self.hits_k})

    def update(self, scores: torch.Tensor, positive: torch.Tensor, query: Optional[torch.Tensor]) -> None:
        """Add a batch: ``scores`` (logits) of its label edges, ``positive`` their bool labels, ``query`` its
        ``edge_label_query`` (``None`` for a shared pool of negatives)."""
        scores = scores.detach()
        self.auroc.update(scores, positive.long())
        if query is not None:
            # torchmetrics' retrieval metrics count an item with a score <= 0 as not retrieved: shift the logits
            # (one shift for the batch, which holds each query whole, so every query's order is kept)
            ranked = scores - scores.min() + 1.0
            self.mrr.update(ranked, positive, indexes=query)
            for metric in self.query_hits.values():
                metric.update(ranked, positive, indexes=query)
        else:
            for metric in self.pool_hits.values():
                metric.update(scores, positive)

    def log_to(self, module: Any, grouped: bool, batch_size: int) -> None:
        """``module.log`` the metric objects this batch's layout updates (computed by Lightning at epoch end)."""
        s = self.stage
        module.log(f"{s}_auroc", self.auroc, prog_bar=True, batch_size=batch_size)
        if grouped:
            module.log(f"{s}_mrr", self.mrr, prog_bar=True, batch_size=batch_size)
            for k, metric in self.query_hits.items():
                module.log(f"{s}_hits@{k}", metric, batch_size=batch_size)
        else:
            for k, metric in self.pool_hits.items():
                module.log(f"{s}_hits@{k}", metric, batch_size=batch_size)
