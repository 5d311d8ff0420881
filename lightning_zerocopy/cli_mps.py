"""Which MPS shares a ``lightning-zerocopy`` run's recipes ask for, read before anything touches CUDA.

The command must start the MPS daemon before LightningCLI imports the recipe's classes (PyG initializes CUDA when
imported), so it reads the ``PipelineCallback`` entry of the recipe files itself: YAML only, no class loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

__all__ = ["RUN_SUBCOMMANDS", "mps_requested_by", "trainer_share_requested_by"]

RUN_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def mps_requested_by(args: Sequence[str]) -> Optional[int]:
    """The pipeline worker's SM share if the recipes named in ``args`` (``--config``/``-c``) list a
    ``PipelineCallback`` with ``mps: true`` for a run subcommand, else ``None``.

    The last recipe that sets ``trainer.callbacks`` decides, as when LightningCLI merges them. A recipe that
    cannot be read, or an invalid share, is skipped here: LightningCLI reports it.
    """
    from lightning_zerocopy.pipeline.mps_launcher import DEFAULT_WORKER_SM_PERCENT

    init_args = _mps_pipeline_args(args)
    if init_args is None:
        return None
    percent = init_args.get("worker_sm_percent", DEFAULT_WORKER_SM_PERCENT)
    if percent == "auto":  # the trainer gets 100 - the smallest share of the ladder the callback tries
        from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER

        percent = SHARE_LADDER[0]
    return _share(percent, 99)


def trainer_share_requested_by(args: Sequence[str]) -> Optional[int]:
    """The trainer's own SM share (``PipelineCallback(trainer_sm_percent=...)``) in the recipe that asks for MPS, or
    ``None`` (``100 - worker_sm_percent``); an invalid one is left to LightningCLI to report."""
    return _share((_mps_pipeline_args(args) or {}).get("trainer_sm_percent"), 100)


def _share(percent: object, top: int) -> Optional[int]:
    """``percent`` if it is an int in [1, ``top``]; anything else is a recipe error LightningCLI reports, naming the
    key, so it is skipped here."""
    return percent if isinstance(percent, int) and not isinstance(percent, bool) and 1 <= percent <= top else None


def _mps_pipeline_args(args: Sequence[str]) -> Optional[dict]:
    """The ``init_args`` of the recipes' ``PipelineCallback`` with ``mps: true`` (not ``in_process``) for a run
    subcommand, or ``None``."""
    import yaml

    if not any(a in RUN_SUBCOMMANDS for a in args) or any(a in ("-h", "--help", "--print_config") or
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
            return init_args
    return None


def _config_paths(args: Sequence[str]) -> list[str]:
    paths = []
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths
