"""LinkPredictor and HeteroLinkPredictor on a GPU: the training step never waits for the device (no host-device
synchronization)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_zerocopy.models import HeteroLinkPredictor, LinkPredictor

from helpers import sync_warnings
from helpers.link_batches import EDGE, NODE, TYPED_FEATURES, TYPED_METADATA, as_typed, planted_graph, train_batches


@pytest.mark.cuda
@pytest.mark.parametrize("kind,loss,mode,decoder", [("untyped", "bce", "binary", "dot"), ("untyped", "bpr", "triplet", "mlp"),
                                                    ("untyped", "margin", "triplet", "dot"), ("typed", None, "binary", None),
                                                    ("typed", None, "triplet", None)])  # fmt: skip
def test_training_step_makes_no_host_sync(kind: str, loss: str, mode: str, decoder: str) -> None:
    """Every step here is a logging step (no trainer: ``log_every_n_steps`` is 1), the worst case. CUDA's sync debug
    mode reports each synchronizing op with the Python frame that called it; any outside PyG's layers (the encoder is
    the user's choice) fails the test: the module's own code and the torchmetrics updates it makes. The typed model
    (its loss chosen by the batch) trains on the same batches as one-type ``HeteroData``."""
    g = planted_graph()
    batch = train_batches(g, 1, 64, mode)[0]
    if kind == "untyped":
        model = LinkPredictor(8, hidden_channels=16, loss=loss, decoder=decoder).cuda()
    else:
        batch = as_typed(batch)
        model = HeteroLinkPredictor(TYPED_METADATA, TYPED_FEATURES, {NODE: g.num_nodes}, EDGE, hidden_channels=16).cuda()
    batch = batch.to("cuda")
    model.training_step(batch, 0).backward()  # warm-up: lazy initializations may synchronize once
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loss = model.training_step(batch, 0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    loss.backward()
    ours = [w for w in sync_warnings(caught) if "torch_geometric" not in w.split(":")[0]]
    assert not ours, f"host-device syncs in {type(model).__name__}'s training step:\n" + "\n".join(ours)
    assert model.train_auroc.compute() >= 0.0  # the step updated the training AUROC (only read here, at the end)
