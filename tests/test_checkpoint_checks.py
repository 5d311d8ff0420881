"""A ``--ckpt_path`` is checked before the run uses it (``checkpoint_checks.py``): a file cut short is named as
damaged (it was fsspec's ``OSError: [Errno 22] Invalid argument``), and weights that do not fit the model name the
first parameter with both shapes and the recipe keys that changed (it was a ``size mismatch`` traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_zerocopy._cli_errors import CommandError
from lightning_zerocopy.checkpoint_checks import check_checkpoint_fits, read_checkpoint


class _Net(pl.LightningModule):
    def __init__(self, in_channels: int = 8, hidden_channels: int = 16, out_channels: int = 3, layers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        sizes = [in_channels] + [hidden_channels] * (layers - 1) + [out_channels]
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))


def _save(tmp_path: Path, model: pl.LightningModule) -> Path:
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "epoch": 1}, path)
    return path


def test_a_checkpoint_cut_short_is_named_as_damaged(tmp_path: Path) -> None:
    path = _save(tmp_path, _Net())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CommandError) as info:
        read_checkpoint(str(path))
    message = str(info.value)
    assert message.startswith(f"--ckpt_path {path} is damaged and cannot be read (") and "cut short" in message
    assert "\n" not in message


@pytest.mark.parametrize(("changed", "expected"), [
    ({"hidden_channels": 32}, "lins.0.weight is [16, 8] in the checkpoint but [32, 8] in the model "
                              "(model.init_args.hidden_channels is 32, 16 in the checkpoint)"),
    ({"in_channels": 12}, "lins.0.weight is [16, 8] in the checkpoint but [16, 12] in the model (data.num_features "
                          "(model.init_args.in_channels) is 12, 8 in the checkpoint)"),
    ({"out_channels": 5}, "lins.1.weight is [3, 16] in the checkpoint but [5, 16] in the model (data.num_classes "
                          "(model.init_args.out_channels) is 5, 3 in the checkpoint)"),
    ({"layers": 3}, "lins.1.weight is [3, 16] in the checkpoint but [16, 16] in the model (model.init_args.layers is "
                    "3, 2 in the checkpoint)"),
])  # fmt: skip
def test_weights_of_another_shape_name_the_first_parameter_and_the_changed_key(tmp_path: Path, changed, expected) -> None:
    path = _save(tmp_path, _Net())
    with pytest.raises(CommandError) as info:
        check_checkpoint_fits(str(path), _Net(**changed))
    assert str(info.value) == (f"--ckpt_path {path} does not fit the model: {expected}. Resume with the recipe the "
                               "checkpoint was trained with, or train anew without --ckpt_path")  # fmt: skip
    check_checkpoint_fits(str(path), _Net())  # the same model fits
