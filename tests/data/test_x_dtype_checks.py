"""Half precision never changes the data silently, through the DataModule (issue 38): ``feature_dtype: float16`` on
features of magnitude ~1e-9 is refused with the count and the fix; ``x_dtype`` is checked at setup like
``feature_dtype`` (a value of 1e5 made ``val_loss = nan``); an ``x_dtype`` the trainer's precision cannot take is
one line naming ``trainer.precision`` (it died in the first layer: ``mat1 and mat2 must have the same dtype``)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch_geometric.data import Data

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.datasets.base import InputDataError
from lightning_zerocopy.datasets.pyg import PyGNodeDataset
from lightning_zerocopy.models import GraphSAGE
from lightning_zerocopy.options import RecipeError

NODES = 600


def _dataset(x: torch.Tensor) -> PyGNodeDataset:
    gen = torch.Generator().manual_seed(1)
    train = torch.rand(NODES, generator=gen) < 0.6
    odd = torch.arange(NODES) % 2 == 1
    return PyGNodeDataset(Data(x=x, y=torch.randint(0, 3, (NODES,), generator=gen),
                               edge_index=torch.randint(0, NODES, (2, 4000), generator=gen), train_mask=train,
                               val_mask=~train & odd, test_mask=~train & ~odd))  # fmt: skip


def test_float16_features_of_magnitude_1e9_are_refused_with_the_count_and_bfloat16() -> None:
    x = torch.rand(NODES, 8, generator=torch.Generator().manual_seed(0)) * 2e-9
    dm = ZeroCopyDataModule(_dataset(x), fanouts=[3], batch_size=32, feature_dtype="float16")
    with pytest.raises(InputDataError) as info:
        dm.setup("fit")
    message = str(info.value)
    assert "4,800 of 4,800 nonzero values (100.00%) become 0 or subnormal" in message, message
    assert "set data.init_args.feature_dtype to bfloat16" in message and "\n" not in message
    bf16 = ZeroCopyDataModule(_dataset(x), fanouts=[3], batch_size=32, feature_dtype="bfloat16")
    bf16.setup("fit")
    try:
        assert bool(next(iter(bf16.train_dataloader())).x.ne(0).all())
    finally:
        bf16.teardown("fit")


@pytest.mark.parametrize(("value", "match"), [(1e5, r"node 7, column 2 does not fit float16"),
                                              (1e-9, r"become 0 or subnormal")])  # fmt: skip
def test_x_dtype_is_checked_at_setup_like_feature_dtype(value: float, match: str) -> None:
    x = torch.randn(NODES, 4, generator=torch.Generator().manual_seed(0))
    if value > 1:
        x[7, 2] = value
    else:
        x[:, :2] = value  # half the values
    dm = ZeroCopyDataModule(_dataset(x), fanouts=[3], batch_size=32, x_dtype="float16")
    with pytest.raises(InputDataError, match=match + r".*data\.init_args\.x_dtype to bfloat16"):
        dm.setup("fit")
    ZeroCopyDataModule(_dataset(x), fanouts=[3], batch_size=32, x_dtype="bfloat16").setup("fit")


def _fit(tmp_path, precision: str, **data) -> pl.Trainer:
    dm = ZeroCopyDataModule(_dataset(torch.randn(NODES, 4)), fanouts=[3], batch_size=64, **data)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), precision=precision)  # fmt: skip
    trainer.fit(GraphSAGE(4, 3, hidden_channels=8), datamodule=dm)
    return trainer


@pytest.mark.parametrize(("precision", "data", "needs"), [
    ("32-true", {"x_dtype": "bfloat16"}, "set trainer.precision to bf16-mixed (or bf16-true), or "
                                         "data.init_args.x_dtype to float32"),
    ("32-true", {"x_dtype": "float16"}, "set trainer.precision to 16-mixed (or 16-true)"),
    ("bf16-true", {}, "set data.init_args.x_dtype to bfloat16, or trainer.precision to bf16-mixed"),
    ("32-true", {"x_dtype": None, "feature_dtype": "bfloat16"}, "x_dtype: null with data.init_args.feature_dtype"),
])  # fmt: skip
def test_an_x_dtype_the_precision_cannot_take_is_one_line_naming_trainer_precision(tmp_path, precision, data,
                                                                                    needs) -> None:  # fmt: skip
    with pytest.raises(RecipeError) as info:
        _fit(tmp_path, precision, **data)
    assert needs in str(info.value) and f"trainer.precision {precision}" in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("precision", "data"), [("bf16-mixed", {"x_dtype": "bfloat16"}),
                                                 ("bf16-true", {"x_dtype": "bfloat16"}), ("32-true", {})])  # fmt: skip
def test_an_x_dtype_the_precision_takes_trains(tmp_path, precision, data) -> None:
    trainer = _fit(tmp_path, precision, **data)
    assert torch.isfinite(trainer.callback_metrics["train_loss"])


def test_a_heterogeneous_x_dtype_is_checked_per_type_at_setup() -> None:
    from helpers.hetero import INST, TinyHeteroDataset

    from lightning_zerocopy import ZeroCopyHeteroDataModule

    class _Huge(TinyHeteroDataset):
        def load(self):
            data = super().load()
            data.x[INST] = data.x[INST].clone()
            data.x[INST][3, 1] = 2e5
            return data

    dm = ZeroCopyHeteroDataModule(_Huge(), num_neighbors=[3, 2], batch_size=8, num_threads=1, x_dtype="float16")
    with pytest.raises(InputDataError, match=rf"features of '{INST}': the value 200000.0 at node 3, column 1 does not "
                                             r"fit float16.*data\.init_args\.x_dtype to bfloat16"):  # fmt: skip
        dm.setup("fit")
