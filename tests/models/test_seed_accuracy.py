"""SeedAccuracy counts like torchmetrics' MulticlassAccuracy(ignore_index=-1) without masking rows out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from lightning_zerocopy.models.seed_accuracy import SeedAccuracy


def test_matches_multiclass_accuracy_and_sums_the_loss_over_labeled_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    ours, reference = SeedAccuracy(ignore_index=-1), MulticlassAccuracy(5, average="micro", ignore_index=-1)
    loss_sum, labeled = 0.0, 0
    for rows in (7, 64, 33):
        logits = torch.randn(rows, 5, generator=gen)
        target = torch.randint(-1, 5, (rows,), generator=gen)
        loss = F.cross_entropy(logits, target, ignore_index=-1)
        ours.update(logits, target, loss)
        reference.update(logits, target)
        n = int((target != -1).sum())
        loss_sum, labeled = loss_sum + float(loss) * n, labeled + n
    assert float(ours.compute()) == pytest.approx(float(reference.compute()), abs=1e-7)
    assert int(ours.labeled) == labeled and float(ours.loss_sum) == pytest.approx(loss_sum, rel=1e-6)


def test_a_batch_without_labels_adds_no_loss_and_no_rows() -> None:
    metric = SeedAccuracy()
    target = torch.full((4,), -1)
    loss = F.cross_entropy(torch.randn(4, 3), target, ignore_index=-1)
    assert torch.isnan(loss)
    metric.update(torch.randn(4, 3), target, loss)
    assert int(metric.labeled) == 0 and float(metric.loss_sum) == 0.0 and torch.isnan(metric.compute())


def test_bad_shapes_name_both_tensors() -> None:
    with pytest.raises(ValueError, match="logits .rows, classes. and target .rows."):
        SeedAccuracy().update(torch.randn(4, 3), torch.zeros(5, dtype=torch.long))
