"""Where a run of the ``lightning-zerocopy`` command writes, and which checkpoint ``--ckpt_path`` names.

**One folder per recipe.** Lightning's default logger puts every run under ``lightning_logs/version_N``, whatever
recipe wrote it, so ``--ckpt_path last`` took another recipe's checkpoint (after ``link_prediction.yaml``, ``predict
--config hetero_mag.yaml --ckpt_path last`` loaded the link predictor), and a README command naming ``version_0``
depended on what ran first. When the recipe leaves ``trainer.logger`` at its default, :func:`default_logger` gives the
logger Lightning would choose (TensorBoard where installed, else CSV) with its runs under
``<default_root_dir>/lightning_logs/<recipe>/version_N``, ``<recipe>`` the name of the last ``--config`` file (or the
model's class without one). The logger is written into the run's ``config.yaml``, so a run started from that file
writes beside it. ``--ckpt_path last`` is then the newest ``last.ckpt`` of this recipe's runs
(:func:`find_last_checkpoint`).

**The class check.** Whatever ``--ckpt_path`` names (a file, or ``last`` once resolved), a checkpoint another module
class wrote is refused in one line naming both (:func:`check_checkpoint_class`): LightningCLI would switch to the
checkpoint's class without a word, or load its weights into the recipe's module with a ``state_dict`` traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from jsonargparse import Namespace
from pytorch_lightning import Trainer
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_zerocopy._cli_errors import CommandError, resolve_class_path

__all__ = [
    "LOG_FOLDER",
    "check_checkpoint_class",
    "default_logger",
    "find_last_checkpoint",
    "run_name",
    "saved_class_path",
]

#: The folder under ``trainer.default_root_dir`` that holds one folder of runs per recipe (Lightning's default name).
LOG_FOLDER = "lightning_logs"

_LAST = re.compile(r"^last(-\d+)?\.ckpt$")  # Lightning's names for ModelCheckpoint(save_last=True)'s file


def run_name(config_files: Sequence[Any], model_class_path: Optional[str]) -> str:
    """The name of a recipe's folder of runs: the stem of the last ``--config`` file, else the model's class name."""
    if config_files:
        return Path(str(config_files[-1])).stem
    return (model_class_path or "model").rpartition(".")[2]


def default_logger(trainer_config: Any, name: str) -> Optional[Namespace]:
    """The logger to put in ``trainer_config`` (a run's ``trainer`` section) when it leaves ``logger`` at Lightning's
    default (``None``/``True``): Lightning's own choice, TensorBoard where ``tensorboard``/``tensorboardX`` is
    installed, else CSV (without Lightning's notice about it), its runs under ``lightning_logs/<name>/``. ``None``
    when the recipe chose a logger (or ``false``)."""
    if trainer_config is None or trainer_config.get("logger") not in (None, True):
        return None
    from lightning_fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE, _TENSORBOARDX_AVAILABLE

    kind = "TensorBoardLogger" if _TENSORBOARD_AVAILABLE or _TENSORBOARDX_AVAILABLE else "CSVLogger"
    from lightning_fabric.plugins.environments import SLURMEnvironment

    root = trainer_config.get("default_root_dir")
    init_args = Namespace(save_dir=os.path.join(root, LOG_FOLDER) if root else LOG_FOLDER, name=name)
    if SLURMEnvironment.job_id() is not None:  # as Lightning's default logger: a SLURM job's runs are named by its id
        init_args["version"] = SLURMEnvironment.job_id()
    return Namespace(class_path=f"pytorch_lightning.loggers.{kind}", init_args=init_args)


def find_last_checkpoint(trainer: Trainer) -> str:
    """The newest ``last.ckpt`` (or ``last-N.ckpt``) under ``trainer``'s run root and checkpoint folders.

    The root is the first logger's ``root_dir`` (it holds every ``version_*`` folder of this recipe, see the module
    docstring) or, without a logger, ``<default_root_dir>/checkpoints`` (where ModelCheckpoint then writes); a
    :class:`ModelCheckpoint` with its own ``dirpath`` is searched too.

    Raises:
        CommandError: no such file, naming the folders searched.
    """
    logger = trainer.loggers[0] if trainer.loggers else None
    if logger is not None:
        roots = [getattr(logger, "root_dir", None) or getattr(logger, "save_dir", None) or trainer.default_root_dir]
    else:
        roots = [os.path.join(trainer.default_root_dir, "checkpoints")]
    roots += [cb.dirpath for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    roots = list(dict.fromkeys(str(Path(r).expanduser().resolve()) for r in roots if r))
    found = [
        Path(folder) / name
        for root in roots
        if os.path.isdir(root)
        for folder, _, files in os.walk(root)
        for name in files
        if _LAST.match(name)
    ]
    if not found:
        raise CommandError(
            f"--ckpt_path last: no last.ckpt under {' or '.join(roots) or 'the run root'} (searched with every "
            "subfolder). Pass the checkpoint's path, or train with a ModelCheckpoint(save_last: true) first."
        )
    return str(max(found, key=lambda p: p.stat().st_mtime_ns))


def saved_class_path(path: str) -> Optional[str]:
    """The ``class_path`` of the module that wrote the checkpoint ``path`` (what LightningCLI records), or ``None``
    for a checkpoint written without the command."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # reads the weights lazily
    except Exception:  # noqa: BLE001  (not a checkpoint this can read: Lightning's load reports it)
        return None
    saved = (checkpoint.get("hyper_parameters") or {}).get("_class_path") if isinstance(checkpoint, dict) else None
    return str(saved) if saved else None


def check_checkpoint_class(path: str, saved: Optional[str], recipe: Optional[str]) -> None:
    """Refuse a checkpoint that another module class wrote than the recipe's ``model.class_path``.

    Args:
        path: the checkpoint, as ``--ckpt_path`` named it (``last`` resolved).
        saved: the class path the checkpoint records (``None``: nothing to check).
        recipe: the recipe's ``model.class_path``.

    Raises:
        CommandError: one line naming both classes and what to pass instead.
    """
    if recipe and saved and recipe != saved and resolve_class_path(recipe) is not resolve_class_path(saved):
        raise CommandError(
            f"--ckpt_path {path} is a checkpoint of {saved}, but the recipe's model.class_path is {recipe}: pass "
            "a checkpoint that model wrote, or the recipe the checkpoint was trained with"
        )
