"""The ``lightning-zerocopy`` command: LightningCLI with any LightningModule and LightningDataModule.

Model and data are chosen by ``class_path``/``init_args`` (subclass mode), so a recipe can name a model of
your own package. The data's ``num_features``/``num_classes`` are linked into the model's
``in_channels``/``out_channels`` when both are instantiated, so a recipe does not repeat them.

    lightning-zerocopy fit --config recipes/quickstart.yaml
    lightning-zerocopy fit --config recipes/quickstart.yaml --print_config
    python -m lightning_zerocopy test --config recipes/quickstart.yaml --ckpt_path last.ckpt

MPS: when a recipe lists ``PipelineCallback`` with ``mps: true``, the command starts the private MPS daemon
before it imports anything that initializes CUDA (``import torch_geometric`` does), so that the trainer becomes
an MPS client with ``100 - worker_sm_percent`` % of the SMs; the callback then joins that daemon. Only the
recipe files (``--config``) are read for this, not command-line overrides of the callback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from pytorch_lightning import LightningDataModule, LightningModule
from pytorch_lightning.cli import ArgsType, LightningArgumentParser, LightningCLI

__all__ = ["ZeroCopyCLI", "build_cli", "main", "mps_requested_by"]

_RUN_SUBCOMMANDS = ("fit", "validate", "test", "predict")


class ZeroCopyCLI(LightningCLI):
    """LightningCLI that links the dataset's shape into the model's constructor."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_features", "model.init_args.in_channels", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.out_channels", apply_on="instantiate")


def build_cli(args: ArgsType = None, run: bool = True) -> ZeroCopyCLI:
    """Parse ``args`` (default ``sys.argv[1:]``), instantiate data, model and trainer, and run the subcommand.

    Args:
        args: command-line arguments, or a dict/list as LightningCLI accepts.
        run: run the subcommand (``False`` only instantiates, for tests and notebooks; then ``args`` has no
            subcommand).
    """
    import lightning_zerocopy.data  # noqa: F401  (registers ZeroCopyDataModule as a known subclass)
    import lightning_zerocopy.models  # noqa: F401
    import lightning_zerocopy.strategies  # noqa: F401  (registers trainer.strategy: zerocopy_ddp)

    return ZeroCopyCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


def mps_requested_by(args: Sequence[str]) -> Optional[int]:
    """The pipeline worker's SM share if the recipes named in ``args`` (``--config``/``-c``) list a
    ``PipelineCallback`` with ``mps: true`` for a run subcommand, else ``None``.

    The last recipe that sets ``trainer.callbacks`` decides, as when LightningCLI merges them. A recipe that
    cannot be read, or an invalid share, is skipped here: LightningCLI reports it.
    """
    import yaml

    from lightning_zerocopy.pipeline.mps import DEFAULT_WORKER_SM_PERCENT

    if not any(a in _RUN_SUBCOMMANDS for a in args) or any(a in ("-h", "--help", "--print_config") or
                                                            a.startswith("--print_config=") for a in args):  # fmt: skip
        return None
    callbacks: Any = None
    for path in _config_paths(args):
        try:
            recipe = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            continue
        trainer = recipe.get("trainer") if isinstance(recipe, dict) else None
        if isinstance(trainer, dict) and "callbacks" in trainer:
            callbacks = trainer["callbacks"]
    for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
        if not isinstance(entry, dict) or str(entry.get("class_path", "")).rsplit(".", 1)[-1] != "PipelineCallback":
            continue
        init_args = entry.get("init_args") or {}
        if init_args.get("mps") is True and init_args.get("mode", "auto") != "in_process":
            percent = init_args.get("worker_sm_percent", DEFAULT_WORKER_SM_PERCENT)
            # anything else is a recipe error that LightningCLI reports, naming the key
            return percent if isinstance(percent, int) and 1 <= percent <= 99 else None
    return None


def _config_paths(args: Sequence[str]) -> list[str]:
    paths = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def main(args: ArgsType = None) -> None:
    """Entry point of the ``lightning-zerocopy`` console script and of ``python -m lightning_zerocopy``.

    Starts the MPS daemon first when the recipe asks for it (see the module docstring), then runs LightningCLI.
    """
    if args is None:
        argv: Optional[list[str]] = sys.argv[1:]
    elif isinstance(args, (list, tuple)):
        argv = [str(a) for a in args]
    else:  # a dict or Namespace: no recipe files to read
        argv = None
    worker_percent = mps_requested_by(argv) if argv is not None else None
    if worker_percent is not None:  # before build_cli imports the DataModule, the model and PyG
        from lightning_zerocopy.pipeline.mps import start_for_trainer

        start_for_trainer(worker_percent)  # a DDP rank re-running this command joins its parent's daemon
    build_cli(args)
