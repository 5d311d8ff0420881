"""The ``lightning-zerocopy`` command: LightningCLI with any LightningModule and LightningDataModule.

Model and data are chosen by ``class_path``/``init_args`` (subclass mode), so a recipe can name a model of
your own package. The data's ``num_features``/``num_classes`` are linked into the model's
``in_channels``/``out_channels`` when both are instantiated, so a recipe does not repeat them.

    lightning-zerocopy fit --config recipes/quickstart.yaml
    lightning-zerocopy fit --config recipes/quickstart.yaml --print_config
    python -m lightning_zerocopy test --config recipes/quickstart.yaml --ckpt_path last.ckpt
"""

from __future__ import annotations

from pytorch_lightning import LightningDataModule, LightningModule
from pytorch_lightning.cli import ArgsType, LightningArgumentParser, LightningCLI

__all__ = ["ZeroCopyCLI", "build_cli", "main"]


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


def main(args: ArgsType = None) -> None:
    """Entry point of the ``lightning-zerocopy`` console script and of ``python -m lightning_zerocopy``."""
    build_cli(args)
