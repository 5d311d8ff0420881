"""What only ZeroCopyHeteroDataModule has: its shape properties, ``num_neighbors`` per edge type, the refusal of an
untyped dataset, hot rows per featured type and the recipe (the batches, determinism, resume, eval, predict and a fit
are checked for both graph kinds in test_batch.py and test_datamodule.py)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import HeteroData

from helpers.hetero import CITES, EDGE_TYPES, EMPLOYS, TinyHeteroDataset
from lightning_zerocopy import ZeroCopyHeteroDataModule
from lightning_zerocopy.data.batch import HeteroBatchBuilder
from lightning_zerocopy.data.datamodule import resolve_num_neighbors
from lightning_zerocopy.datasets.hetero import edge_type_str


def _datamodule(**kwargs) -> ZeroCopyHeteroDataModule:
    options = dict(num_neighbors=[3, 2], batch_size=8, num_threads=1)
    options.update(kwargs)
    return ZeroCopyHeteroDataModule(TinyHeteroDataset(), **options)


def test_shape_properties_come_from_the_dataset_without_loading() -> None:
    dataset = TinyHeteroDataset()
    module = ZeroCopyHeteroDataModule(dataset, num_neighbors=[2])
    assert module.metadata == (["paper", "author", "institution"], EDGE_TYPES)
    assert module.num_features == {"paper": 8, "institution": 4}
    assert module.num_nodes == {"paper": 40, "author": 60, "institution": 7}
    assert module.num_classes == 3 and module.input_type == "paper"
    assert dataset._data is None  # nothing loaded


def test_num_neighbors_per_edge_type_and_its_errors() -> None:
    resolved = resolve_num_neighbors({"paper__cites__paper": [5, 1], "author__writes__paper": [2, 2],
                                      "paper__rev_writes__author": [1, 1], "institution__employs__author": [-1, 3]},
                                     EDGE_TYPES, "k")  # fmt: skip
    assert resolved[CITES] == [5, 1] and resolved[EMPLOYS] == [-1, 3]
    assert resolve_num_neighbors([4], EDGE_TYPES, "k") == {et: [4] for et in EDGE_TYPES}
    with pytest.raises(ValueError, match=r"unknown edge type 'paper__writes__author'.*paper__cites__paper"):
        _datamodule(num_neighbors={"paper__writes__author": [2]})
    with pytest.raises(ValueError, match="same number of hops"):
        _datamodule(num_neighbors={"paper__cites__paper": [2, 2], "author__writes__paper": [2],
                                   "paper__rev_writes__author": [2], "institution__employs__author": [2]})  # fmt: skip
    with pytest.raises(ValueError, match="no fanouts for the edge type 'author__writes__paper'"):
        _datamodule(num_neighbors={"paper__cites__paper": [2]})
    with pytest.raises(ValueError, match=r"eval_num_neighbors"):
        _datamodule(eval_num_neighbors={"nope__x__paper": [1]})


def test_homogeneous_datasets_are_refused() -> None:
    # (hybrid/auto placements are taken: tests/data/test_hetero_hybrid_placement.py)
    with pytest.raises(TypeError, match="HeteroNodeDataset"):
        ZeroCopyHeteroDataModule(object(), num_neighbors=[2])  # type: ignore[arg-type]


def _cpu_batch(module, split="train", step=0):
    builder = module.builder(split)
    builder.sampler_placement = builder.gpu_sampler_placement = "cpu"
    builder.gather = "cpu"
    try:
        return builder.open(module.resources).build_batch(module.plan(split).item(0, step))
    finally:
        builder.close()


def _assert_same_batch(gpu: HeteroData, cpu: HeteroData) -> None:
    for node_type in cpu.node_types:
        for key, value in cpu[node_type].items():
            other = gpu[node_type][key]
            if isinstance(value, torch.Tensor):
                assert other.is_cuda and torch.equal(other.cpu(), value), (node_type, key)
            else:
                assert other == value, (node_type, key)
    for et in cpu.edge_types:
        for key in ("edge_index", "e_id"):
            assert torch.equal(gpu[et][key].cpu(), cpu[et][key]), (et, key)
        assert gpu[et].num_sampled_edges == cpu[et].num_sampled_edges


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["uva", "gpu"])
@pytest.mark.parametrize("gather", ["cpu", "zerocopy"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_placements_and_zerocopy_gather_equal_the_cpu_batch(placement: str, gather: str, split: str) -> None:
    module = _datamodule(sampler_placement=placement, gather=gather)
    module.setup("fit")
    try:
        for step in range(2):
            gpu = module.builder(split).open(module.resources).build_batch(module.plan(split).item(0, step))
            _assert_same_batch(gpu, _cpu_batch(module, split, step))
        # the sampler reads one topology, the fused CSC of every edge type: no per-edge-type copy on the GPU
        assert sorted(module.resources._topology) == [("fused", placement)]
    finally:
        module.teardown("fit")


@pytest.mark.cuda
def test_cpu_sampler_with_zerocopy_gather_builds_on_the_gpu() -> None:
    module = _datamodule(sampler_placement="cpu", gather="zerocopy", x_dtype="bfloat16")
    module.setup("fit")
    try:
        batch = module.builder("train").open(module.resources).build_batch(module.plan("train").item(0, 0))
        cpu = _cpu_batch(module)
        assert batch["paper"].x.dtype == torch.bfloat16 and batch["paper"].x.is_cuda
        assert torch.equal(batch["paper"].n_id.cpu(), cpu["paper"].n_id)
        assert torch.equal(batch["institution"].x.cpu(), cpu["institution"].x)
    finally:
        module.teardown("fit")


@pytest.mark.cuda
def test_a_typed_builder_keeps_each_featured_types_hot_rows_on_the_gpu() -> None:
    """``hot_rows`` on a typed builder: each featured type's most frequent in-neighbors (over the edge types from that
    type) in GPU memory, the batches bitwise the CPU builder's."""
    module = _datamodule(gather="zerocopy")
    module.setup("fit")
    try:
        builder = HeteroBatchBuilder(module.handles, module.fanouts, num_threads=1, gather="zerocopy", hot_rows=5)
        builder.open(module.resources)
        assert {t: table.num_hot_rows for t, table in builder._gpu.features.items()} == {"paper": 5, "institution": 5}
        for step in range(2):
            _assert_same_batch(builder.build_batch(module.plan("train").item(0, step)), _cpu_batch(module, "train", step))
    finally:
        module.teardown("fit")


@pytest.mark.parametrize("per_edge_type", [True, False])
def test_the_cli_builds_it_from_a_recipe_and_links_the_shapes(tmp_path, per_edge_type: bool) -> None:
    from lightning_zerocopy.cli import build_cli

    config = {
        "data": {"class_path": "lightning_zerocopy.ZeroCopyHeteroDataModule", "init_args": {
            "dataset": {"class_path": "helpers.hetero.TinyHeteroDataset"},
            "num_neighbors": {edge_type_str(et): [2, 1] for et in EDGE_TYPES} if per_edge_type else [2, 1],
            "batch_size": 4}},
        "model": {"class_path": "helpers.hetero.HeteroShapeProbe"},
        "trainer": {"logger": False, "default_root_dir": str(tmp_path)},
    }  # fmt: skip
    cli = build_cli(config, run=False)
    assert isinstance(cli.datamodule, ZeroCopyHeteroDataModule)
    assert cli.datamodule.fanouts[CITES] == [2, 1]
    assert cli.model.hparams.in_channels == {"paper": 8, "institution": 4} and cli.model.hparams.out_channels == 3
