"""Per-hop trimming (``lightning_zerocopy.models.trim``) on real batches of ``ZeroCopyDataModule``: the seed
logits equal the untrimmed ones, each layer sees fewer rows, and ``trim=False`` turns it off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch_geometric.data import Data

from lightning_zerocopy import SyntheticGraph, ZeroCopyDataModule
from lightning_zerocopy.models import GAT, GraphSAGE, NodeClassifier
from lightning_zerocopy.models.trim import batch_hop_counts, counts_for_layers

FEATURES, CLASSES = 12, 4


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Data]]:
    """Two training batches (fanouts [6, 4]: 2 hops) and two validation batches (eval_fanouts [5, 3, 2]: 3 hops)."""
    cache = tmp_path_factory.mktemp("trim") / "cache"
    dataset = SyntheticGraph(num_nodes=2500, avg_degree=8, num_features=FEATURES, num_classes=CLASSES, cache_dir=str(cache))
    dm = ZeroCopyDataModule(dataset, fanouts=[6, 4], eval_fanouts=[5, 3, 2], batch_size=48, seed=3)
    dm.prepare_data()
    dm.setup("fit")
    try:
        return {
            "train": [b for _, b in zip(range(2), dm.train_dataloader())],
            "val": [b for _, b in zip(range(2), dm.val_dataloader())],
        }
    finally:
        dm.teardown("fit")


def _pair(cls, num_layers: int) -> tuple[NodeClassifier, NodeClassifier]:
    torch.manual_seed(0)
    trimmed = cls(FEATURES, CLASSES, hidden_channels=16, num_layers=num_layers).eval()
    plain = cls(FEATURES, CLASSES, hidden_channels=16, num_layers=num_layers, trim=False).eval()
    plain.load_state_dict(trimmed.state_dict())
    return trimmed, plain


def _rows_per_layer(model: NodeClassifier, batch: Data) -> list[int]:
    """Rows of ``x`` each conv layer of ``model`` receives for ``batch``."""
    rows: list[int] = []
    hooks = [conv.register_forward_pre_hook(lambda _m, args: rows.append(args[0].size(0))) for conv in model.net.convs]
    try:
        with torch.no_grad():
            model._seed_logits(batch)
    finally:
        for h in hooks:
            h.remove()
    return rows


@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
@pytest.mark.parametrize("num_layers", [2, 3])  # as many layers as training hops, and more
@pytest.mark.parametrize("split", ["train", "val"])  # validation batches have 3 hops: more than 2 layers
def test_trimmed_seed_logits_equal_untrimmed(batches, cls, num_layers: int, split: str) -> None:
    trimmed, plain = _pair(cls, num_layers)
    for batch in batches[split]:
        assert batch.x.dtype == torch.float32 and batch.x.std() > 0
        with torch.no_grad():
            out, y = trimmed._seed_logits(batch)
            ref, _ = plain._seed_logits(batch)
        assert out.shape == (batch.batch_size, CLASSES) and torch.equal(y, batch.y[: batch.batch_size])
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert ref.abs().max() > 0
        nodes, hops = batch.num_sampled_nodes, len(batch.num_sampled_edges)
        kept = [min(hops, num_layers - i) for i in range(num_layers)]  # hops layer i still needs
        assert _rows_per_layer(trimmed, batch) == [sum(nodes[: k + 1]) for k in kept]
        assert _rows_per_layer(plain, batch) == [batch.num_nodes] * num_layers


@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
def test_trimmed_predictions_and_training_step(batches, cls) -> None:
    trimmed, plain = _pair(cls, 2)
    batch = batches["val"][0]
    out, ref = trimmed.predict_step(batch, 0), plain.predict_step(batch, 0)
    assert torch.equal(out["n_id"], batch.n_id[: batch.batch_size])
    torch.testing.assert_close(out["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
    trimmed.train()
    loss = trimmed.training_step(batches["train"][0], 0)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in trimmed.net.convs[0].parameters())


def test_batch_without_hop_counts_runs_untrimmed() -> None:
    gen = torch.Generator().manual_seed(1)
    full = Data(x=torch.randn(30, FEATURES, generator=gen), edge_index=torch.randint(0, 30, (2, 90), generator=gen),
                y=torch.randint(0, CLASSES, (30,), generator=gen), batch_size=30)  # fmt: skip
    assert batch_hop_counts(full, 2) is None
    trimmed, plain = _pair(GraphSAGE, 2)
    assert _rows_per_layer(trimmed, full) == [30, 30]
    torch.testing.assert_close(trimmed._seed_logits(full)[0], plain._seed_logits(full)[0])


def test_counts_are_fitted_to_the_layers() -> None:
    x, edge_index = torch.randn(10, 2), torch.zeros(2, 9, dtype=torch.long)
    more_hops = counts_for_layers(x, edge_index, [2, 3, 5], [3, 6], num_layers=1)
    assert (more_hops.x.size(0), more_hops.edge_index.size(1)) == (5, 3)
    assert (more_hops.nodes_per_hop, more_hops.edges_per_hop) == ([2, 3], [3])
    fewer_hops = counts_for_layers(x, edge_index, torch.tensor([2, 3, 5]), torch.tensor([3, 6]), num_layers=4)
    assert fewer_hops.x is x and (fewer_hops.nodes_per_hop, fewer_hops.edges_per_hop) == ([2, 3, 5, 0, 0], [3, 6, 0, 0])


def test_counts_that_do_not_match_the_batch_raise(batches) -> None:
    batch = batches["train"][0].clone()
    batch.x = batch.x[:-1]  # a transform that dropped a node and kept the counts
    with pytest.raises(ValueError, match=r"num_sampled_nodes sums to .*\(model.trim: false\)"):
        GraphSAGE(FEATURES, CLASSES, hidden_channels=8)._seed_logits(batch)
    with pytest.raises(ValueError, match="one node count per hop"):
        counts_for_layers(batch.x, batch.edge_index, [1, 2], [1, 2], num_layers=2)


def test_trim_needs_a_net_that_takes_hop_counts() -> None:
    with pytest.raises(ValueError, match="num_sampled_nodes_per_hop.*set trim=False"):
        NodeClassifier(nn.Linear(4, 2), 2, trim=True)
    assert NodeClassifier(nn.Linear(4, 2), 2).trim is False


def test_a_hand_written_layer_loop_trims_with_pyg_trim_to_layer(batches) -> None:
    """The README's recipe for a user's own module: ``batch_hop_counts`` + PyG's ``trim_to_layer`` per layer."""
    from torch_geometric.nn import SAGEConv
    from torch_geometric.utils import trim_to_layer

    torch.manual_seed(0)
    convs = nn.ModuleList([SAGEConv(FEATURES, 16), SAGEConv(16, 16), SAGEConv(16, CLASSES)])

    def run(x, edge_index, hops=None):
        for i, conv in enumerate(convs):
            if hops is not None:
                x, edge_index, _ = trim_to_layer(i, hops.nodes_per_hop, hops.edges_per_hop, x, edge_index)
            x = conv(x, edge_index).relu() if i < len(convs) - 1 else conv(x, edge_index)
        return x

    for batch in batches["train"] + batches["val"]:  # 2 and 3 hops for 3 layers
        hops = batch_hop_counts(batch, len(convs))
        with torch.no_grad():
            out = run(hops.x, hops.edge_index, hops)
            ref = run(batch.x, batch.edge_index)
        assert out.size(0) < batch.num_nodes
        torch.testing.assert_close(out[: batch.batch_size], ref[: batch.batch_size], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("cls", [GraphSAGE, GAT])
def test_trimming_gpu_built_batches_without_synchronizing(tmp_path: Path, cls) -> None:
    """Batches built on the GPU (GPU sampler, zero-copy gather): fitting the counts reads no device value, and
    the trimmed seed logits equal the untrimmed ones, in fp32 and under bf16 autocast."""
    dataset = SyntheticGraph(num_nodes=5000, avg_degree=8, num_features=FEATURES, num_classes=CLASSES,
                             cache_dir=str(tmp_path / "cache"))  # fmt: skip
    dm = ZeroCopyDataModule(dataset, fanouts=[6, 4], eval_fanouts=[5, 3, 2], batch_size=64, seed=3,
                            sampler_placement="gpu", gather="zerocopy")  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    try:
        batch = next(iter(dm.train_dataloader()))
        assert batch.x.is_cuda
        trimmed, plain = (m.cuda() for m in _pair(cls, 2))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            hops = batch_hop_counts(batch, 2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert hops.x.size(0) == batch.num_nodes and hops.nodes_per_hop == list(batch.num_sampled_nodes)
        for bf16, tol in ((False, 1e-4), (True, 1e-1)):  # a wrong trim is off by O(1)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                out, ref = trimmed._seed_logits(batch)[0], plain._seed_logits(batch)[0]
            torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    finally:
        dm.teardown("fit")
