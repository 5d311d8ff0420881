"""``HeteroNodeClassifier`` on hand-built batches in PyG's hetero ``NeighborLoader`` layout (``helpers.hetero_batches``):
trimmed and untrimmed logits agree on the seeds, featureless types are embedded from ``n_id``, it learns a planted
task through ``Trainer``, it takes the graph's shape from a DataModule in ``configure_model``, and checkpoints
restore the same logits (``load_from_checkpoint`` and a new Trainer's ``ckpt_path``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from helpers.hetero_batches import BatchList, batches, mag_like_graph, metadata, sample_batch

from lightning_zerocopy.models import HeteroNodeClassifier
from lightning_zerocopy.models.trim import hetero_counts_for_layers

SEEDS = 16


@pytest.fixture(scope="module")
def graph() -> Any:
    return mag_like_graph()


def _model(graph: Any, **kwargs: Any) -> HeteroNodeClassifier:
    node_types, edge_types = metadata(graph)
    kwargs.setdefault("hidden_channels", 16)
    return HeteroNodeClassifier(graph.num_features, graph.num_classes, node_types=node_types, edge_types=edge_types,
                                num_nodes=graph.num_nodes, input_type=graph.input_type, **kwargs)  # fmt: skip


def _trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("max_epochs", 1)
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path), **kwargs)  # fmt: skip


@pytest.mark.parametrize("conv", ["sage", "gat"])
@pytest.mark.parametrize("fanouts", [[4, 3], [5], [3, 3, 2], "per-edge-type"],
                         ids=["hops=layers", "fewer-hops", "more-hops", "per-edge-type"])  # fmt: skip
def test_trimmed_logits_equal_untrimmed_on_the_seeds(graph: Any, conv: str, fanouts: Any) -> None:
    torch.manual_seed(0)
    model = _model(graph, conv=conv, num_layers=2).eval()
    if fanouts == "per-edge-type":  # num_neighbors as a dict, one relation not sampled at all
        fanouts = {e: ([6, 2] if e[1] == "cites" else [0, 0] if e[1] == "rev_has_topic" else [2, 2]) for e in graph.edge_types}
    batch = sample_batch(graph, torch.arange(SEEDS), fanouts)
    with torch.no_grad():
        model.trim = False
        full = model(batch)
        model.trim = True
        trimmed = model(batch)
    assert full.shape[0] == batch["paper"].num_nodes
    if len(fanouts) >= 2:  # as PyG's trim_to_layer: the last of 2 layers runs on the seeds and hop 1 only
        assert trimmed.shape[0] == sum(batch["paper"].num_sampled_nodes[:2]) < full.shape[0]
    torch.testing.assert_close(trimmed[:SEEDS], full[:SEEDS], rtol=1e-5, atol=1e-6)


def test_trimming_cuts_each_layer_to_the_hops_it_needs(graph: Any) -> None:
    """A layer sees fewer rows of each type than the whole sample (the work trimming saves)."""
    model = _model(graph, num_layers=2).eval()
    batch = sample_batch(graph, torch.arange(SEEDS), [4, 3])
    seen: list[dict[str, int]] = []
    for layer in model.net.convs:
        for conv in layer.values():
            conv.register_forward_hook(lambda m, args, out: seen.append({"src": args[0][0].size(0), "dst": args[0][1].size(0)}))
    with torch.no_grad():
        model(batch)
    first, last = seen[: len(model.net.layer_relations[0])], seen[len(model.net.layer_relations[0]) :]
    hop1 = sum(batch["paper"].num_sampled_nodes[:2])
    assert [s["dst"] for s in last] == [hop1] * len(last), last  # layer 2: the seeds and hop 1, not hop 2
    assert max(s["src"] for s in last) <= max(sum(batch[t].num_sampled_nodes[:2]) for t in batch.node_types)
    assert max(s["dst"] for s in first) == batch["paper"].num_nodes  # layer 1 runs on the whole sample


def test_counts_that_do_not_describe_the_batch_name_the_type(graph: Any) -> None:
    batch = sample_batch(graph, torch.arange(SEEDS), [4, 3])
    nodes = dict(batch.num_sampled_nodes_dict)
    nodes["paper"] = [n + 1 for n in nodes["paper"]]
    with pytest.raises(ValueError, match="paper.num_sampled_nodes"):
        hetero_counts_for_layers(batch.x_dict, batch.edge_index_dict, nodes, batch.num_sampled_edges_dict, 2)
    cut = hetero_counts_for_layers(batch.x_dict, batch.edge_index_dict, batch.num_sampled_nodes_dict,
                                   batch.num_sampled_edges_dict, 1)  # fmt: skip
    assert cut.x_dict["paper"].size(0) == sum(batch["paper"].num_sampled_nodes[:2])
    assert all(len(c) == 1 for c in cut.edges_per_hop.values())


def test_featureless_types_are_embedded_from_n_id(graph: Any) -> None:
    model = _model(graph, num_layers=2).eval()
    net = model.net
    assert set(net.embeddings) == {"author", "institution", "field_of_study"}
    assert net.embeddings["author"].num_embeddings == graph.num_nodes["author"]
    batch = sample_batch(graph, torch.arange(SEEDS), [4, 3])
    inputs = net.inputs(batch.x_dict, batch.n_id_dict)
    torch.testing.assert_close(inputs["author"], net.embeddings["author"].weight[batch["author"].n_id])
    torch.testing.assert_close(inputs["paper"], batch["paper"].x)
    with torch.no_grad():
        before = model(batch)[:SEEDS].clone()
        absent = sorted(set(range(graph.num_nodes["author"])) - set(batch["author"].n_id.tolist()))[0]
        net.embeddings["author"].weight[absent] += 10.0  # an author not in the batch changes nothing
        torch.testing.assert_close(model(batch)[:SEEDS], before)
        writer = batch["author", "writes", "paper"].edge_index
        seed_author = int(batch["author"].n_id[writer[0, writer[1] < SEEDS][0]])
        net.embeddings["author"].weight[seed_author] += 10.0  # an author of a seed paper does
        assert not torch.allclose(model(batch)[:SEEDS], before)


def test_only_parameters_that_reach_the_seeds_are_built(graph: Any) -> None:
    """The last layer holds only the relations into the input type, so every parameter gets a gradient (DDP needs
    no find_unused_parameters)."""
    model = _model(graph, num_layers=2)
    assert all(key.endswith("__paper") for key in model.net.convs[-1])
    batch = sample_batch(graph, torch.arange(SEEDS), [4, 3])
    model(batch)[:SEEDS].sum().backward()
    unused = [name for name, p in model.named_parameters() if p.grad is None]
    assert not unused, unused


def test_shape_arguments_all_or_none(graph: Any) -> None:
    with pytest.raises(ValueError, match="edge_types"):
        HeteroNodeClassifier(graph.num_features, graph.num_classes, node_types=graph.node_types, input_type="paper")
    model = HeteroNodeClassifier(graph.num_features, graph.num_classes)
    with pytest.raises(RuntimeError, match="no layers yet"):
        model(sample_batch(graph, torch.arange(4), [2, 2]))


def _split(graph: Any) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(graph.num_nodes["paper"], generator=torch.Generator().manual_seed(1))
    return perm[:200], perm[200:]


@pytest.mark.parametrize("conv", ["sage", "gat"])
def test_learns_a_planted_task_through_the_trainer(graph: Any, tmp_path: Path, conv: str) -> None:
    train_ids, val_ids = _split(graph)
    train = batches(graph, train_ids, 20, [5, 3])
    val = batches(graph, val_ids, 50, [5, 3], seed=99)
    torch.manual_seed(0)
    model = _model(graph, conv=conv, dropout=0.2, optimizer=lambda params: torch.optim.Adam(params, lr=0.01))
    before = _trainer(tmp_path).validate(model, val, verbose=False)[0]["val_acc"]
    trainer = _trainer(tmp_path, max_epochs=5, log_every_n_steps=5)
    trainer.fit(model, train, val)
    after = trainer.callback_metrics["val_acc"].item()
    assert after > 0.7 and after > before + 0.2, (before, after)  # 4 classes: chance is 0.25
    assert "train_acc_epoch" in trainer.callback_metrics and "train_loss" in trainer.callback_metrics


class _HeteroShapeDataModule(pl.LightningDataModule):
    """The shape half of ``ZeroCopyHeteroDataModule``'s interface, over pre-built batches."""

    def __init__(self, graph: Any, train: BatchList, val: BatchList) -> None:
        super().__init__()
        self.graph, self.train, self.val = graph, train, val

    @property
    def metadata(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        return metadata(self.graph)

    @property
    def num_nodes(self) -> dict[str, int]:
        return dict(self.graph.num_nodes)

    @property
    def input_type(self) -> str:
        return self.graph.input_type

    def train_dataloader(self) -> BatchList:
        return self.train

    def val_dataloader(self) -> BatchList:
        return self.val

    def predict_dataloader(self) -> BatchList:
        return self.val


def test_configure_model_builds_from_the_datamodule_and_checkpoints_round_trip(graph: Any, tmp_path: Path) -> None:
    train_ids, val_ids = _split(graph)
    dm = _HeteroShapeDataModule(graph, batches(graph, train_ids[:60], 20, [4, 3]), batches(graph, val_ids, 50, [4, 3], seed=7))
    torch.manual_seed(0)
    model = HeteroNodeClassifier(graph.num_features, graph.num_classes, hidden_channels=16)
    assert model.net is None
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    assert model.net is not None and model.input_type == "paper"
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    model.eval()
    with torch.no_grad():
        expected = [model(b)[: b["paper"].batch_size] for b in dm.val]

    restored = HeteroNodeClassifier.load_from_checkpoint(path).eval()
    with torch.no_grad():
        for b, want in zip(dm.val, expected):
            torch.testing.assert_close(restored(b)[: b["paper"].batch_size], want)

    fresh = HeteroNodeClassifier(graph.num_features, graph.num_classes, hidden_channels=16)  # no shape, no DataModule
    out = _trainer(tmp_path).predict(fresh, dm.val, ckpt_path=str(path))
    for b, got, want in zip(dm.val, out, expected):
        torch.testing.assert_close(got["logits"], want)
        torch.testing.assert_close(got["n_id"], b["paper"].n_id[: b["paper"].batch_size])

    fresh = HeteroNodeClassifier(graph.num_features, graph.num_classes, hidden_channels=16)  # through the DataModule
    out = _trainer(tmp_path).predict(fresh, datamodule=dm, ckpt_path=str(path))
    torch.testing.assert_close(out[0]["logits"], expected[0])


def test_a_datamodule_of_another_graph_is_refused(graph: Any, tmp_path: Path) -> None:
    other = mag_like_graph()
    other.edge_types = [e for e in other.edge_types if e[1] != "cites"]
    model = _model(graph)
    dm = _HeteroShapeDataModule(other, BatchList([sample_batch(graph, torch.arange(4), [2, 2])]), BatchList([]))
    with pytest.raises(ValueError, match="edge_types"):
        _trainer(tmp_path, max_steps=1, limit_val_batches=0).fit(model, datamodule=dm)


def test_types_and_relations_that_never_reach_the_seeds_are_ignored(graph: Any) -> None:
    """A node type no relation connects to the input type gets no embedding, and its relation is not run."""
    node_types, edge_types = metadata(graph)
    model = HeteroNodeClassifier(graph.num_features, graph.num_classes, hidden_channels=16, node_types=node_types + ["venue"],
                                 edge_types=edge_types + [("venue", "hosts", "venue")],
                                 num_nodes={**graph.num_nodes, "venue": 5}, input_type="paper").eval()  # fmt: skip
    assert "venue" not in model.net.embeddings and "venue" not in model.net.input_types
    batch = sample_batch(graph, torch.arange(SEEDS), [4, 3])
    batch["venue"].n_id = torch.arange(2)
    batch["venue"].num_sampled_nodes = [0, 2, 0]
    batch["venue", "hosts", "venue"].edge_index = torch.tensor([[0], [1]])
    batch["venue", "hosts", "venue"].num_sampled_edges = [1, 0]
    with torch.no_grad():
        trimmed = model(batch)[:SEEDS]
        model.trim = False
        torch.testing.assert_close(model(batch)[:SEEDS], trimmed)


def test_no_shape_and_no_datamodule_says_what_is_missing(graph: Any, tmp_path: Path) -> None:
    model = HeteroNodeClassifier(graph.num_features, graph.num_classes)
    loader = BatchList([sample_batch(graph, torch.arange(4), [2, 2])])
    with pytest.raises(RuntimeError, match="no layers yet"):
        _trainer(tmp_path, max_steps=1).fit(model, loader)


class _PlainDataModule(pl.LightningDataModule):
    """A DataModule with batches and nothing about the graph's shape, as PyG's ``LightningNodeData`` is."""

    def __init__(self, train: BatchList) -> None:
        super().__init__()
        self.train = train

    def train_dataloader(self) -> BatchList:
        return self.train


def test_a_model_given_its_shape_trains_with_a_datamodule_that_has_none(graph: Any, tmp_path: Path) -> None:
    """The shape given to the model is enough: a DataModule without ``metadata``/``num_nodes``/``input_type`` (PyG's
    ``LightningNodeData``, the benchmark's PyG row) trains it; without a shape, that DataModule is named."""
    train_ids, _ = _split(graph)
    dm = _PlainDataModule(batches(graph, train_ids[:40], 20, [4, 3]))
    model = _model(graph)
    _trainer(tmp_path, max_steps=2).fit(model, datamodule=dm)
    assert model.net is not None and model.global_step == 2
    with pytest.raises(ValueError, match="_PlainDataModule has no metadata, num_nodes, input_type"):
        _trainer(tmp_path, max_steps=1).fit(HeteroNodeClassifier(graph.num_features, graph.num_classes), datamodule=dm)
