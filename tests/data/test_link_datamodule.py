"""ZeroCopyLinkDataModule: a PyG-style link module trains unchanged; setup checks; loaders; predict. What the link
DataModules do alike for untyped and typed graphs (PyG's LinkNeighborLoader fields checked against the graph, binary
and triplet, fixed negatives, determinism, resume, predict rows) is checked on both (``kind``: ``helpers.kinds``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers.kinds import LINK_KINDS, assert_same_fields, edges, fields, nodes
from helpers.link import PyGLinkModule, TinyLinkGraph, auroc

from lightning_zerocopy import ZeroCopyLinkDataModule
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.data.host.share import typed_arrays
from lightning_zerocopy.data.link_plan import LinkBatchPlan
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.datasets.link_checks import pair_keys
from lightning_zerocopy.graph.schema import edge_type_str
from lightning_zerocopy.models import LinkPredictor


def _trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(accelerator="cpu", devices=1, default_root_dir=str(tmp_path), **kwargs)


def _datamodule(**kwargs) -> ZeroCopyLinkDataModule:
    dataset = kwargs.pop("dataset", None) or TinyLinkGraph()
    kwargs.setdefault("num_neighbors", [5, 5])
    kwargs.setdefault("batch_size", 64)
    return ZeroCopyLinkDataModule(dataset, **kwargs)


def test_pyg_style_link_module_trains_unchanged_and_learns(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dm = _datamodule()
    model = PyGLinkModule(dm.num_features)
    _trainer(tmp_path, max_epochs=4, num_sanity_val_steps=0).fit(model, datamodule=dm)
    val_steps = -(-dm.dataset.load().split("val").num_positives // 64)
    scores, labels = (torch.cat(t) for t in zip(*model.val_scores[-val_steps:]))
    assert labels.sum() > 0 and (labels == 0).sum() == 3 * labels.sum()  # K = 3 fixed negatives per positive
    assert auroc(scores, labels) > 0.9  # chance is 0.5; community features make the pairs separable


def test_num_classes_is_absent_and_num_features_is_the_datasets() -> None:
    dm = _datamodule()
    assert dm.num_features == 8
    assert getattr(dm, "num_classes", None) is None


class _Broken(TinyLinkGraph):
    """A TinyLinkGraph with one thing wrong in its splits."""

    def __init__(self, fault: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault = fault

    def load(self):
        data = super().load()
        train = data.splits["train"]
        if self.fault == "out_of_range":
            train.pos_edge_index[1, 5] = data.num_nodes + 3
        elif self.fault == "nan_feature":
            data.x[7, 2] = float("nan")
        elif self.fault.startswith("label"):  # "label<value>": the train split's labels, one of them <value>
            train.edge_label = torch.ones(train.num_positives)
            train.edge_label[11] = float(self.fault[len("label"):])
        elif self.fault == "repeats":
            train.pos_edge_index = torch.cat([train.pos_edge_index, train.pos_edge_index[:, :4], torch.tensor([[9], [9]])], 1)
        elif self.fault == "empty":
            data.splits["val"].pos_edge_index = torch.empty(2, 0, dtype=torch.int64)
            data.splits["val"].neg_edge_index = torch.empty(2, 0, dtype=torch.int64)
        return data


@pytest.mark.parametrize(
    "dataset, kwargs, match",
    [
        (_Broken("out_of_range"), {}, r"data\.init_args\.dataset \(_Broken\).*train.*node id 403"),
        (_Broken("empty"), {}, r"data\.init_args\.dataset \(_Broken\).*val.*no positive edge"),
        (TinyLinkGraph(with_labels=True), {"neg_sampling": "triplet"}, "edge_label is given, but triplet"),
        (_Broken("nan_feature"), {}, r"nan at node 7, column 2.*data\.init_args\.check_features: false"),
        (_Broken("label2"), {}, r"data\.init_args\.dataset \(_Broken\): the train split .* holds edge_label 2 for its "
                                r"positive 11 .* a link label is 1 \(an edge\) or 0 \(none\)"),
        (_Broken("label-1"), {}, r"the train split .* holds edge_label -1 for its positive 11"),
        (_Broken("label0.5"), {}, r"the train split .* holds edge_label 0\.5 for its positive 11"),
    ],
)
def test_setup_rejects_bad_splits_naming_them_and_keeps_nothing(dataset, kwargs, match) -> None:
    dm = _datamodule(dataset=dataset, **kwargs)
    with pytest.raises(ValueError, match=match):
        dm.setup("fit")
    assert dm.resources is None and dm._handles is None  # nothing left mapped
    with pytest.raises(RuntimeError, match="not set up"):
        dm.plan("train")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"neg_sampling_ratio": -1.0}, r"data\.init_args\.neg_sampling_ratio must be a finite number >= 0"),
        ({"neg_sampling": "negative"}, r"data\.init_args\.neg_sampling mode must be one of \('binary', 'triplet'\)"),
        ({"neg_sampling": {"mode": "triplet", "amount": 0}}, "integer >= 1"),
        ({"num_neighbors": [5, 0]}, r"data\.init_args\.num_neighbors"),
        ({"predict_split": "all"}, r"data\.init_args\.predict_split"),
        ({"batch_size": 0}, r"data\.init_args\.batch_size"),
        ({"subgraph_type": "induced"}, r"data\.init_args\.subgraph_type='induced' is not supported.*'directional'"),
        ({"disjoint": True}, r"data\.init_args\.disjoint=true is not supported"),
        ({"disjoint": "yes"}, r"data\.init_args\.disjoint must be true or false"),
    ],
)
def test_bad_arguments_fail_at_init_naming_the_key(kwargs, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        _datamodule(**kwargs)


def test_pyg_loader_defaults_for_subgraph_type_and_disjoint_are_accepted() -> None:
    """A PyG recipe's data block names them at PyG's defaults, which are what our batches are."""
    dm = _datamodule(subgraph_type="directional", disjoint=False)
    assert (dm.subgraph_type, dm.disjoint) == ("directional", False)


def test_a_nan_feature_passes_when_the_scan_is_turned_off() -> None:
    dm = _datamodule(dataset=_Broken("nan_feature"), check_features=False)
    dm.setup("fit")
    try:
        assert dm.plan("train") is not None
    finally:
        dm.teardown("fit")


def test_a_node_dataset_is_refused_with_the_class_to_use(tmp_path: Path) -> None:
    from lightning_zerocopy.datasets import SyntheticGraph

    with pytest.raises(TypeError, match="must be a LinkDataset.*ZeroCopyDataModule"):
        ZeroCopyLinkDataModule(SyntheticGraph(num_nodes=100, cache_dir=str(tmp_path)))


def test_node_order_changes_no_supervision_edge_or_feature_row() -> None:
    plain, ordered = _datamodule(seed=3), _datamodule(seed=3, node_order="bfs")
    for dm in (plain, ordered):
        dm.setup("fit")
    try:
        x = plain.dataset.load().x
        for split in ("train", "val"):
            a = plain.builder(split).open(plain.resources).build_batch(plain.plan(split).item(0, 1))
            b = ordered.builder(split).open(ordered.resources).build_batch(ordered.plan(split).item(0, 1))
            assert torch.equal(a.input_id, b.input_id)
            assert torch.equal(a.n_id[a.edge_label_index], b.n_id[b.edge_label_index])  # same global pairs
            assert torch.equal(a.edge_label, b.edge_label)
            assert torch.equal(b.x, x[b.n_id])
    finally:
        plain.teardown("fit")
        ordered.teardown("fit")


def test_degree_weighted_negatives_never_draw_a_node_without_edges() -> None:
    dm = _datamodule(neg_sampling={"mode": "binary", "amount": 4, "src_weight": "degree", "dst_weight": "degree"})
    dm.setup("fit")
    try:
        edge_index = dm.dataset.load().edge_index
        out_deg = torch.bincount(edge_index[0], minlength=400)
        in_deg = torch.bincount(edge_index[1], minlength=400)
        plan = dm.plan("train")
        items = [plan.item(0, s) for s in range(len(plan))]
        src = torch.cat([it.seed_ids[it.link_fields["edge_label_index"][0, it.num_positives :]] for it in items])
        dst = torch.cat([it.seed_ids[it.link_fields["edge_label_index"][1, it.num_positives :]] for it in items])
        assert bool((out_deg[src] > 0).all()) and bool((in_deg[dst] > 0).all())
        # frequency follows the degree: the top-degree decile is drawn far more than the bottom one
        order = out_deg.argsort()
        counts = torch.bincount(src, minlength=400)
        assert counts[order[-40:]].sum() > 2 * counts[order[:40]].sum()
    finally:
        dm.teardown("fit")


def test_without_negative_sampling_batches_hold_the_positives_only() -> None:
    dm = _datamodule(neg_sampling=None, dataset=TinyLinkGraph(with_labels=True))
    dm.setup("fit")
    try:
        batch = next(iter(dm.train_dataloader()))
        assert batch.edge_label_index.shape == (2, batch.batch_size)
        labels = dm.link_splits["train"].edge_label
        assert torch.equal(batch.edge_label, labels[batch.input_id])  # not shifted: there are no negatives
        val = next(iter(dm.val_dataloader()))  # the split's fixed negatives still come with val
        assert val.edge_label_index.shape[1] == 4 * val.batch_size
    finally:
        dm.teardown("fit")


def _val_scores(dm: ZeroCopyLinkDataModule, model: torch.nn.Module) -> torch.Tensor:
    """Rows (src, dst, query, score bits) of every val label edge, sorted: comparable across batchings."""
    rows = []
    dm.setup("validate")
    try:
        with torch.no_grad():
            for batch in dm.val_dataloader():
                scores = model._binary_scores(batch)[0]
                src, dst = batch.n_id[batch.edge_label_index]
                bits = scores.view(torch.int32).to(torch.int64)
                rows.append(torch.stack([src, dst, batch.edge_label_query, bits], dim=1))
    finally:
        dm.teardown("validate")
    out = torch.cat(rows)
    for column in (3, 2, 1, 0):  # stable sorts: lexicographic by (src, dst, query, bits)
        out = out[out[:, column].sort(stable=True).indices]
    return out


@pytest.mark.parametrize("eval_num_neighbors", [[5, 5], [4, 3, 2]])
def test_val_scores_do_not_depend_on_the_eval_batch_size(eval_num_neighbors: list[int]) -> None:
    """Validation samples every node keyed by node (as ZeroCopyDataModule does), and the fixed negatives are the
    split's: each label edge's score is bitwise the same whether the val edges come 100 or 1000 at a time."""
    from lightning_zerocopy.models import LinkPredictor

    torch.manual_seed(0)
    model = LinkPredictor(8, hidden_channels=16, num_layers=len(eval_num_neighbors)).eval()
    results = [_val_scores(_datamodule(eval_num_neighbors=eval_num_neighbors, eval_batch_size=size), model)
               for size in (100, 1000)]  # fmt: skip
    assert results[0].shape[0] == 4 * TinyLinkGraph().load().split("val").num_positives
    assert torch.equal(results[0], results[1])
    dm = _datamodule(eval_num_neighbors=eval_num_neighbors)
    dm.setup("fit")
    try:
        assert dm.plan("val").sampler_seed == "split" and dm.plan("train").sampler_seed == "batch"
    finally:
        dm.teardown("fit")


class _RecordedLinkPredictor(LinkPredictor):
    """LinkPredictor that keeps the logit of every edge it scores in ``test`` and in ``predict``, by (src, dst, query)."""

    def on_test_start(self) -> None:
        self.tested: dict[tuple[int, int, int], float] = {}

    def on_predict_start(self) -> None:
        self.predicted: dict[tuple[int, int, int], float] = {}

    def _keep(self, into: dict, batch, logits: torch.Tensor) -> None:
        edges = batch.n_id[batch.edge_label_index]
        for src, dst, query, logit in zip(*edges.tolist(), batch.edge_label_query.tolist(), logits.tolist()):
            into[(src, dst, query)] = logit

    def test_step(self, batch, batch_idx):
        self._keep(self.tested, batch, self._binary_scores(batch)[0])
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        out = super().predict_step(batch, batch_idx, dataloader_idx)
        self._keep(self.predicted, batch, out["logits"])
        return out


def test_predict_scores_an_edge_as_test_does_bitwise(tmp_path: Path) -> None:
    """``predict`` samples ``predict_split`` with that split's seed, as ``test`` does: same batches, same logits."""
    torch.manual_seed(0)
    dm = _datamodule(eval_batch_size=16)
    model = _RecordedLinkPredictor(dm.num_features, hidden_channels=16, hits_k=[1])
    trainer = _trainer(tmp_path)
    trainer.test(model, datamodule=dm)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    assert len(model.tested) == 4 * dm.dataset.load().split("test").num_positives  # K = 3 negatives per positive
    assert model.predicted == model.tested  # every edge, every bit



def test_setup_warns_about_repeated_and_self_loop_supervision_edges_with_counts() -> None:
    dm = _datamodule(dataset=_Broken("repeats"))
    with pytest.warns(UserWarning, match=r"data\.init_args\.dataset \(_Broken\): the train split .* holds 4 repeated "
                                         r"positive edges .*; 1 positive self-loop \(e\.g\. \(9, 9\)\)"):
        dm.setup("fit")
    dm.teardown("fit")


@pytest.mark.parametrize("x_dtype", ["float32", None])
def test_feature_dtype_halves_the_host_table_and_x_is_delivered_as_x_dtype(x_dtype) -> None:
    dm = _datamodule(feature_dtype="bfloat16", x_dtype=x_dtype)
    dm.setup("fit")
    try:
        x = dm.dataset.load().x
        assert dm.resources.host.features.data.dtype == torch.bfloat16
        batch = dm.builder("train").open(dm.resources).build_batch(dm.plan("train").item(0, 0))
        expected = x[batch.n_id].to(torch.bfloat16)
        assert batch.x.dtype == (torch.float32 if x_dtype == "float32" else torch.bfloat16)
        assert torch.equal(batch.x, expected.to(batch.x.dtype))  # the rounded rows, cast once where the batch is built
    finally:
        dm.teardown("fit")


def test_a_bad_feature_dtype_names_the_link_key() -> None:
    with pytest.raises(ValueError, match=r"data\.init_args\.feature_dtype"):
        _datamodule(feature_dtype="int8")


# ---- on both graph kinds -----------------------------------------------------------------------------------------


def _check_subgraph(batch, view, node_keyed: bool = False) -> None:
    """Every sampled edge is an edge of its type in the graph (through ``n_id`` and ``e_id``); ``n_id`` unique per type
    (``node_keyed``, evaluation: unique per hop, a node may come again at a later level); ``x`` the rows of ``n_id``."""
    by_type = nodes(batch)
    for (src, rel, dst), store in edges(batch).items():
        sampled = torch.stack([by_type[src].n_id[store.edge_index[0]], by_type[dst].n_id[store.edge_index[1]]])
        assert torch.equal(sampled, view.edge_index[(src, rel, dst)][:, store.e_id])
        assert sum(store.num_sampled_edges) == store.edge_index.shape[1]
    for node_type, store in by_type.items():
        assert sum(store.num_sampled_nodes) == store.n_id.numel()
        levels = store.n_id.split(store.num_sampled_nodes) if node_keyed else [store.n_id]
        assert all(level.unique().numel() == level.numel() for level in levels)
        if node_type in view.x:
            assert torch.equal(store.x, view.x[node_type][store.n_id])


def _assert_seeds(batch, endpoints: dict) -> None:
    """Each endpoint type's seeds (hop 0 of its ``n_id``) are its endpoints in the batch, unique and sorted."""
    for node_type, ids in endpoints.items():
        store = nodes(batch)[node_type]
        assert torch.equal(store.n_id[: store.num_sampled_nodes[0]], torch.cat(ids).unique()), node_type


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_binary_batches_map_back_to_the_graph_and_seed_each_endpoint_type(tmp_path: Path, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path, batch_size=40, neg_sampling_ratio=2.0)
    dm.setup("fit")
    try:
        data, et = dm.dataset.load(), kind.supervised(dm)
        view, train = typed_arrays(data), data.splits["train"].pos_edge_index
        loader = dm.train_dataloader()
        assert isinstance(loader, PlanLoader) and isinstance(loader.plan, LinkBatchPlan)
        batches = list(loader)
        assert len(batches) == len(loader) == -(-train.shape[1] // 40)
        seen = []
        for batch in batches:
            store = kind.label_store(batch, et)
            b = store.batch_size
            assert not any("y" in s for s in nodes(batch).values())  # no node labels in a link batch
            pairs = kind.pairs(batch, et)
            assert pairs.shape == (2, 3 * b)  # B positives, then ceil(2 B) negatives
            assert torch.equal(pairs[:, :b], train[:, store.input_id])  # each endpoint through its own type's n_id
            assert torch.equal(store.edge_label, torch.cat([torch.ones(b), torch.zeros(2 * b)]))
            assert int(pairs[0].max()) < view.num_nodes[et[0]] and int(pairs[1].max()) < view.num_nodes[et[2]]
            endpoints = defaultdict(list)  # one node type on both ends: its seeds are both rows' endpoints
            endpoints[et[0]].append(pairs[0])
            endpoints[et[2]].append(pairs[1])
            _assert_seeds(batch, endpoints)
            _check_subgraph(batch, view)
            seen.append(store.input_id)
        assert torch.equal(torch.cat(seen).sort().values, torch.arange(train.shape[1]))  # every positive once
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_triplet_batches_put_the_indices_on_the_endpoint_types(tmp_path: Path, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path, batch_size=40, neg_sampling={"mode": "triplet", "amount": 3})
    dm.setup("fit")
    try:
        data, et = dm.dataset.load(), kind.supervised(dm)
        train = data.splits["train"].pos_edge_index
        batch = next(iter(dm.train_dataloader()))
        store, src, dst = kind.label_store(batch, et), nodes(batch)[et[0]], nodes(batch)[et[2]]
        b = store.batch_size
        assert "edge_label_index" not in store and src.src_index.shape == (b,)
        assert dst.dst_pos_index.shape == (b,) and dst.dst_neg_index.shape == (b, 3)
        assert torch.equal(src.n_id[src.src_index], train[0, store.input_id])
        assert torch.equal(dst.n_id[dst.dst_pos_index], train[1, store.input_id])
        assert int(dst.dst_neg_index.max()) < dst.num_sampled_nodes[0]  # negatives are seeds of the destination type
        endpoints = defaultdict(list)
        endpoints[et[0]].append(src.n_id[src.src_index])
        endpoints[et[2]] += [dst.n_id[dst.dst_pos_index], dst.n_id[dst.dst_neg_index].view(-1)]
        _assert_seeds(batch, endpoints)
        _check_subgraph(batch, typed_arrays(data))
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_val_batches_score_the_fixed_negatives_of_their_positives(tmp_path: Path, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path, eval_batch_size=16)
    dm.setup("fit")
    try:
        data, et = dm.dataset.load(), kind.supervised(dm)
        view, val = typed_arrays(data), data.splits["val"]
        k, space = val.neg_per_positive, max(view.num_nodes[et[0]], view.num_nodes[et[2]])
        positives = torch.cat([s.pos_edge_index for s in data.splits.values()], 1)
        linked = pair_keys(positives[0], positives[1], space)
        count = 0
        for batch in dm.val_dataloader():
            store = kind.label_store(batch, et)
            b, ids = store.batch_size, store.input_id
            pairs = kind.pairs(batch, et)
            negatives = val.neg_edge_index.view(2, -1, k)[:, ids].reshape(2, -1)
            assert torch.equal(pairs, torch.cat([val.pos_edge_index[:, ids], negatives], 1))
            assert torch.equal(store.edge_label_query, torch.cat([ids, ids.repeat_interleave(k)]))
            assert torch.equal(pairs[0, b:], pairs[0, :b].repeat_interleave(k))  # the same source
            assert not torch.isin(pair_keys(pairs[0, b:], pairs[1, b:], space), linked).any()  # never a positive
            if kind.typed:  # the generator draws each positive's negatives distinct
                assert all(row.unique().numel() == k for row in pairs[1, b:].view(b, k))
            _check_subgraph(batch, view, node_keyed=True)
            count += b
        assert count == val.num_positives
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_batches_are_deterministic_and_the_epochs_differ(tmp_path: Path, kind) -> None:
    def epoch_batches(epoch: int) -> list[dict]:
        dm = kind.datamodule(tmp_path=tmp_path, seed=3)
        dm.setup("fit")
        try:
            loader = dm.train_dataloader()
            loader.set_epoch(epoch)
            return [fields(batch) for batch in loader]
        finally:
            dm.teardown("fit")

    first, again, other = epoch_batches(1), epoch_batches(1), epoch_batches(2)
    assert len(first) == len(again) > 1
    for i, (a, b) in enumerate(zip(first, again)):
        assert_same_fields(a, b, i)
    label_index = next(k for k in first[0] if k[1] == "edge_label_index")
    assert not torch.equal(first[0][label_index], other[0][label_index])


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_a_restored_loader_state_resumes_the_epoch_with_the_same_batches(tmp_path: Path, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path, seed=5)
    dm.setup("fit")
    try:
        loader = dm.train_dataloader()
        loader.set_epoch(1)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        rest = [fields(batch) for batch in it]
        resumed = dm.train_dataloader()
        resumed.load_state_dict(state)
        again = [fields(batch) for batch in resumed]
        assert len(again) == len(rest) > 0
        for i, (a, b) in enumerate(zip(again, rest)):
            assert_same_fields(a, b, i)
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("kind", LINK_KINDS, ids=str)
def test_predict_writes_one_row_per_scored_edge(tmp_path: Path, kind) -> None:
    dm = kind.datamodule(tmp_path=tmp_path, eval_batch_size=32)
    writer = PredictionWriter(output_dir=str(tmp_path / "out"))
    _trainer(tmp_path, callbacks=[writer]).predict(kind.model(dm), datamodule=dm, return_predictions=False)
    rows, et = dict(np.load(tmp_path / "out" / "predictions.npz")), kind.supervised(dm)
    assert ("edge_type" in rows) == kind.typed and (not kind.typed or str(rows["edge_type"]) == edge_type_str(et))
    test, view = dm.dataset.load().splits["test"], typed_arrays(dm.dataset.load())
    assert rows["src"].shape == (test.num_positives * (1 + test.neg_per_positive),)
    assert set(rows) >= {"score", "logit", "label", "query"}
    space = max(view.num_nodes[et[0]], view.num_nodes[et[2]])
    expected = torch.cat([test.pos_edge_index, test.neg_edge_index], 1)
    got = torch.stack([torch.from_numpy(rows["src"]), torch.from_numpy(rows["dst"])])
    key = lambda e: pair_keys(e[0], e[1], space).sort().values  # noqa: E731
    assert torch.equal(key(got), key(expected))
    assert int(rows["label"].sum()) == test.num_positives and ((rows["score"] > 0) & (rows["score"] < 1)).all()
