"""Checks of a ``--ckpt_path`` before the run uses it: a damaged file is named as damaged, and weights that do not fit
the model name the first parameter that differs, with both shapes and the recipe key that changed.

Without them, a ``last.ckpt`` cut short (by a kill during the write, or a full disk) failed with fsspec's ``OSError:
[Errno 22] Invalid argument``, and a resume with another ``hidden_channels``, feature count or class count with
PyTorch's ``size mismatch`` traceback, one line per parameter.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.parameter import is_lazy

from lightning_zerocopy._cli_errors import CommandError

__all__ = ["check_checkpoint_fits", "read_checkpoint"]

#: Model arguments the command links from the data (``data.num_features`` → ``in_channels``, ...): a change in them
#: comes from the dataset, so the message names the data's key.
_LINKED = {"in_channels": "data.num_features", "out_channels": "data.num_classes"}


def read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path`` (tensors memory-mapped where the format allows, so nothing large is read).

    Raises:
        CommandError: it cannot be read: named as damaged, with the fix.
    """
    try:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)  # the legacy format cannot mmap
    except Exception as exc:  # noqa: BLE001 - any failure to read it: cut short, not a checkpoint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CommandError(
            f"--ckpt_path {path} is damaged and cannot be read ({first}); it may have been cut short by a kill or a "
            "full disk: resume from another checkpoint of the run (e.g. an epoch=*.ckpt beside it), or train without "
            "--ckpt_path"
        ) from exc
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CommandError(f"--ckpt_path {path} holds no model weights (no state_dict): it is not a Lightning "
                           "checkpoint")
    return checkpoint


def check_checkpoint_fits(path: str, model: torch.nn.Module) -> None:
    """Raise when the weights of the checkpoint at ``path`` cannot be loaded into ``model`` (strictly, as Lightning
    loads them): the first parameter whose shape differs, else the first missing or unexpected one.

    Raises:
        CommandError: one line: the parameter, both shapes, and the model arguments that differ from those saved in
            the checkpoint (as recipe keys).
    """
    checkpoint = read_checkpoint(path)
    saved, own = checkpoint["state_dict"], model.state_dict()
    problem: Optional[str] = None
    for name, tensor in saved.items():
        if name in own and not is_lazy(own[name]) and tuple(own[name].shape) != tuple(tensor.shape):
            problem = f"{name} is {list(tensor.shape)} in the checkpoint but {list(own[name].shape)} in the model"
            break
    if problem is None:
        missing = [n for n in own if n not in saved]
        unexpected = [n for n in saved if n not in own]
        if missing:
            problem = f"the model's {missing[0]} is not in the checkpoint ({len(missing)} such)"
        elif unexpected:
            problem = f"the checkpoint's {unexpected[0]} is not in the model ({len(unexpected)} such)"
    if problem is None:
        return
    changed = _changed_arguments(checkpoint.get("hyper_parameters") or {}, dict(getattr(model, "hparams", {}) or {}))
    why = f" ({'; '.join(changed)})" if changed else ""
    raise CommandError(f"--ckpt_path {path} does not fit the model: {problem}{why}. Resume with the recipe the "
                       "checkpoint was trained with, or train anew without --ckpt_path")  # fmt: skip


def _changed_arguments(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``<recipe key> is <now>, <saved> in the checkpoint`` for each plain model argument that differs."""
    changed = []
    for key, value in now.items():
        if key not in saved or not isinstance(value, (int, float, str, bool, list, tuple)):
            continue
        if saved[key] != value:
            where = f"{_LINKED[key]} (model.init_args.{key})" if key in _LINKED else f"model.init_args.{key}"
            changed.append(f"{where} is {value!r}, {saved[key]!r} in the checkpoint")
    return changed
