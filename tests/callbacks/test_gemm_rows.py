"""GemmRowBuckets: every linear product runs on a bucketed row count; the model's outputs and gradients stay those of
the real rows; the hooks come off at teardown; a bad multiple names the key."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GraphSAGE

from lightning_zerocopy.callbacks import GemmRowBuckets
from lightning_zerocopy.callbacks.gemm_rows import pad_linear_rows


def _graph(nodes: int = 203, edges: int = 900, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(nodes, 12, generator=g), torch.randint(0, nodes, (2, edges), generator=g)


def _run(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x, edge_index)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_a_pyg_model_gives_the_same_outputs_and_gradients_on_bucketed_products() -> None:
    torch.manual_seed(0)
    model = GraphSAGE(12, 32, num_layers=2, out_channels=5)
    x, edge_index = _graph()
    plain_out, plain_grads = _run(model, x, edge_index)
    rows: list[int] = []
    linear = F.linear

    def recording(input: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        rows.append(input.shape[0])
        return linear(input, *args, **kwargs)

    handles = pad_linear_rows(model, 64)
    assert len(handles) == 2 * sum(1 for m in model.modules() if type(m).__name__ == "Linear")
    with mock.patch.object(F, "linear", recording):
        padded_out, padded_grads = _run(model, x, edge_index)
    assert rows and all(r % 64 == 0 for r in rows), rows  # 203 rows -> 256
    assert padded_out.shape == plain_out.shape
    torch.testing.assert_close(padded_out, plain_out)
    for padded, plain in zip(padded_grads, plain_grads):
        torch.testing.assert_close(padded, plain)
    for handle in handles:
        handle.remove()
    rows.clear()
    with mock.patch.object(F, "linear", recording):
        _run(model, x, edge_index)
    assert 203 in rows  # undone


def test_a_row_count_already_on_the_multiple_and_other_ranks_are_left_alone() -> None:
    layer = torch.nn.Linear(4, 3)
    pad_linear_rows(layer, 8)
    x = torch.randn(16, 4)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    three_d = torch.randn(2, 5, 4)
    assert layer(three_d).shape == (2, 5, 3)
    assert layer(torch.randn(5, 4)).shape == (5, 3)


def test_the_callback_pads_during_the_fit_and_removes_its_hooks_at_teardown() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    callback = GemmRowBuckets(multiple=32)
    callback.setup(None, module, "fit")  # type: ignore[arg-type]
    assert callback.layers == 2
    callback.setup(None, module, "validate")  # type: ignore[arg-type]
    assert callback.layers == 2  # not twice
    callback.teardown(None, module, "fit")  # type: ignore[arg-type]
    assert callback.layers == 0 and not module[0]._forward_pre_hooks and not module[0]._forward_hooks


@pytest.mark.parametrize("multiple", [0, -64, 1.5, "64", True])
def test_a_multiple_that_is_not_a_whole_number_from_one_names_the_key(multiple: object) -> None:
    with pytest.raises(ValueError, match=r"GemmRowBuckets: multiple must be a whole number >= 1"):
        GemmRowBuckets(multiple=multiple)  # type: ignore[arg-type]


def test_a_recipe_turns_it_on_and_a_fit_runs_every_product_on_the_multiple(tmp_path, monkeypatch) -> None:
    """Chosen in the YAML (here as the command line's callbacks entry), it pads the recipe's own model."""
    from pathlib import Path

    from lightning_zerocopy.cli import build_cli

    quickstart = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    monkeypatch.setenv("LIGHTNING_ZEROCOPY_CACHE", str(tmp_path / "cache"))
    cli = build_cli(["--config", str(quickstart), "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}",
                     "--trainer.max_steps=3", "--trainer.limit_val_batches=0", "--trainer.enable_checkpointing=false",
                     '--trainer.callbacks+={"class_path": "lightning_zerocopy.callbacks.GemmRowBuckets", '
                     '"init_args": {"multiple": 32}}'], run=False)  # fmt: skip
    buckets = [c for c in cli.trainer.callbacks if isinstance(c, GemmRowBuckets)]
    assert len(buckets) == 1 and buckets[0].multiple == 32
    rows: list[int] = []
    linear = F.linear

    def recording(input: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        rows.append(input.shape[0])
        return linear(input, *args, **kwargs)

    with mock.patch.object(F, "linear", recording):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 3 and rows and all(r % 32 == 0 for r in rows), rows
    assert buckets[0].layers == 0  # taken off at teardown
