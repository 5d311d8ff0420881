"""The ``lightning-zerocopy`` command: LightningCLI with any LightningModule and LightningDataModule.

Model and data are chosen by ``class_path``/``init_args`` (subclass mode), so a recipe can name a model of
your own package. What the data knows (``num_features``, ``num_classes``, a heterogeneous graph's ``metadata()`` and
``num_nodes``) is linked into the model's arguments of PyG's names (``in_channels``, ``out_channels``, ``metadata``,
...) that the model has, when both are instantiated, so a recipe does not repeat them (:mod:`lightning_zerocopy.cli_links`).

    lightning-zerocopy fit --config recipes/quickstart.yaml
    lightning-zerocopy fit --config recipes/quickstart.yaml --print_config
    python -m lightning_zerocopy test --config recipes/quickstart.yaml --ckpt_path last
    lightning-zerocopy predict --config recipes/quickstart.yaml --ckpt_path last   # writes predictions.npz

A recipe may name classes of modules in the current folder (``model.class_path: mymod.MyGNN``): the command puts
it first on ``sys.path``, as ``python -m lightning_zerocopy`` does.

Each recipe's runs go to ``lightning_logs/<recipe>/version_N`` (:mod:`lightning_zerocopy.cli_runs`), and
``--ckpt_path last`` resumes from the newest ``last.ckpt`` there (the logger's root; without a logger
``default_root_dir``), not only in this run's own new version folder, where Lightning alone finds none and starts from
step 0; with none anywhere the command stops, naming where it looked; a checkpoint of another module class is refused.
Lightning's notices a user must ignore are filtered by message (:mod:`lightning_zerocopy.cli_output`). ``validate``/``test``/``predict`` refuse to run without ``--ckpt_path`` (an untrained model would be scored or
used silently) unless ``--allow_untrained true`` is given. ``predict`` writes the predictions with
:class:`~lightning_zerocopy.callbacks.predictions.PredictionWriter` unless the recipe lists a prediction writer.
User errors (a bad key, type or value in the recipe) print one message naming the YAML key and exit with status
2, and so do bad data found during the run (a damaged dataset file, a bad split, label or feature value: an
:class:`~lightning_zerocopy.datasets.base.InputDataError`) and settings found not to fit together when the run starts
(a :class:`~lightning_zerocopy.options.RecipeError`); ``LZC_TRACEBACK=1`` shows the full traceback instead.

MPS: when a recipe lists ``PipelineCallback`` with ``mps: true``, the command starts the private MPS daemon
before it imports anything that initializes CUDA (``import torch_geometric`` does), so that the trainer becomes
an MPS client with ``100 - worker_sm_percent`` % of the SMs (or ``trainer_sm_percent``); the callback then joins that
daemon. Only the recipe files (``--config``) are read for this (:mod:`~lightning_zerocopy.cli_mps`), not command-line
overrides of the callback.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from jsonargparse import DefaultHelpFormatter
from pytorch_lightning import LightningDataModule, LightningModule, Trainer
from pytorch_lightning.callbacks import BasePredictionWriter, ModelCheckpoint
from pytorch_lightning.cli import ArgsType, LightningArgumentParser, LightningCLI

from lightning_zerocopy._cli_errors import (
    TRACEBACK_ENV,
    CommandError,
    ZeroCopyArgumentParser,
    describe_build_error,
    resolve_class_path,
    traceback_requested,
)
from lightning_zerocopy.cli_output import quiet_lightning_notices
from lightning_zerocopy.cli_links import ModelInstantiator, add_data_links, predict_step_hint, yaml_metadata
from lightning_zerocopy.cli_mps import mps_requested_by, trainer_share_requested_by
from lightning_zerocopy.cli_runs import (
    check_checkpoint_class,
    default_logger,
    find_last_checkpoint,
    run_name,
    saved_class_path,
)

__all__ = ["CommandError", "ZeroCopyCLI", "build_cli", "find_last_checkpoint", "main", "mps_requested_by",
           "trainer_share_requested_by"]

_RECIPES = Path(__file__).resolve().parents[1] / "recipes"
DESCRIPTION = f"""lightning-zerocopy: train, evaluate and predict with a PyTorch Lightning + PyG GNN on mini-batches
sampled from a graph in shared host memory. A YAML recipe names the data, the model and the trainer.

  lightning-zerocopy fit --config RECIPE.yaml                        train
  lightning-zerocopy test --config RECIPE.yaml --ckpt_path CKPT      evaluate a checkpoint (also: validate)
  lightning-zerocopy predict --config RECIPE.yaml --ckpt_path CKPT   write predictions.npz to the log dir
  lightning-zerocopy fit --config RECIPE.yaml --print_config         the full recipe, defaults included

Recipes to start from: {_RECIPES if _RECIPES.is_dir() else "recipes/ in the source repository"}
  (quickstart.yaml: GraphSAGE on a generated graph, on the CPU).
The options of a data or model class, with defaults:
  lightning-zerocopy fit --data.help lightning_zerocopy.ZeroCopyDataModule
  lightning-zerocopy fit --model.help lightning_zerocopy.models.GraphSAGE
Every key of a subcommand: lightning-zerocopy fit --help. Errors print one message; {TRACEBACK_ENV}=1 shows the
full traceback."""


class _RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help formatter that keeps the description's line breaks."""


class ZeroCopyCLI(LightningCLI):
    """LightningCLI that links the dataset's shape into the model's constructor, refuses to evaluate an untrained
    model, writes predictions to disk and reports build errors as one message naming the YAML key."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        add_data_links(parser)
        parser.add_argument(
            "--allow_untrained",
            type=bool,
            default=False,
            help="validate/test/predict without --ckpt_path, i.e. with the model's initial weights",
        )

    def _add_instantiators(self) -> None:
        """LightningCLI's instantiators, the model's replaced by :class:`~lightning_zerocopy.cli_links.ModelInstantiator`."""
        super()._add_instantiators()
        self.parser.add_instantiator(ModelInstantiator(self), LightningModule, subclasses=self.subclass_mode_model)

    def before_instantiate_classes(self) -> None:
        """Refuses ``validate``/``test``/``predict`` without ``--ckpt_path`` (before any data is built); with
        ``trainer.enable_checkpointing: false`` drops the recipe's checkpoint callbacks; keeps runs apart per recipe
        and Lightning's notices out of the output (:mod:`~lightning_zerocopy.cli_output`)."""
        quiet_lightning_notices(self.subcommand)
        self._drop_checkpoints_when_checkpointing_is_off()
        self._keep_runs_apart_per_recipe()
        if self.subcommand in ("validate", "test", "predict"):
            config = self.config[self.subcommand]
            if config.get("ckpt_path") is None and not config.get("allow_untrained"):
                raise CommandError(
                    f"`{self.subcommand}` needs the trained weights: pass --ckpt_path PATH (a checkpoint written by "
                    "`fit`, e.g. lightning_logs/version_0/checkpoints/*.ckpt). To run the untrained model on purpose, "
                    "pass --allow_untrained true."
                )
        if self.subcommand in ("fit", "validate", "test", "predict"):
            path = self.config[self.subcommand].get("ckpt_path")
            special = path is None or path in ("last", "best", "hpc") or str(path).startswith("registry") or "://" in str(path)
            if not special and not os.path.isfile(path):
                raise CommandError(f"--ckpt_path {path}: no such checkpoint file (relative paths start at {os.getcwd()})")

    def _keep_runs_apart_per_recipe(self) -> None:
        """Lightning's default logger, with this recipe's runs in a folder of their own
        (:func:`~lightning_zerocopy.cli_runs.default_logger`)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        logger = default_logger(config.get("trainer"), run_name(config.get("config") or [], config.get("model.class_path")))
        if logger is not None:
            config["trainer"]["logger"] = logger

    def _drop_checkpoints_when_checkpointing_is_off(self) -> None:
        """Every shipped recipe lists a ``ModelCheckpoint`` (for ``last.ckpt``), and Lightning refuses one beside
        ``enable_checkpointing=False``: an override that turns checkpointing off wins over the recipe's callbacks."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer")
        callbacks = trainer.get("callbacks") if trainer is not None else None
        if trainer is None or trainer.get("enable_checkpointing") is not False or not isinstance(callbacks, list):
            return

        def is_checkpoint(callback: Any) -> bool:
            cls = resolve_class_path(str(getattr(callback, "class_path", "")))
            return isinstance(callback, ModelCheckpoint) or (isinstance(cls, type) and issubclass(cls, ModelCheckpoint))

        trainer["callbacks"] = [c for c in callbacks if not is_checkpoint(c)]

    def _parse_ckpt_path(self) -> None:
        """As LightningCLI's (the checkpoint's saved hyperparameters become the model's config), but a checkpoint that
        another module class wrote is refused, naming both classes (:func:`~lightning_zerocopy.cli_runs.check_checkpoint_class`),
        and a saved ``metadata`` is kept as YAML writes it (lists; the model gets tuples)."""
        subcommand = self.config.get("subcommand")
        recipe = self.config.get(f"{subcommand}.model.class_path") if subcommand else None
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path and os.path.isfile(path):  # a damaged file is named as damaged (checkpoint_checks.py)
            from lightning_zerocopy.checkpoint_checks import read_checkpoint

            read_checkpoint(path)
        super()._parse_ckpt_path()
        if subcommand:
            check_checkpoint_class(str(self.config[subcommand].get("ckpt_path")),
                                   self.config.get(f"{subcommand}.model.class_path"), recipe)  # fmt: skip
            yaml_metadata(self.config[subcommand].get("model"))

    def instantiate_classes(self) -> None:
        """As LightningCLI's, but an exception becomes a :class:`CommandError` naming the recipe key."""
        try:
            super().instantiate_classes()
        except CommandError:
            raise
        except Exception as exc:
            raise CommandError(describe_build_error(exc, self.config)) from exc

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with a :class:`PredictionWriter` added for ``predict`` unless a writer is configured."""
        trainer = super().instantiate_trainer(**kwargs)
        from lightning_zerocopy.run_guards import guard_the_run  # SIGTERM, output folders, plain ddp's rank watch

        guard_the_run(trainer, str(self.subcommand))
        if self.subcommand == "predict" and not any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks):
            from lightning_zerocopy.callbacks.layerwise_predictions import LayerwisePredictionWriter
            from lightning_zerocopy.callbacks.predictions import PredictionWriter

            layerwise = getattr(self.datamodule, "predict_mode", None) == "layerwise"  # data.init_args.predict_mode
            trainer.callbacks.append(LayerwisePredictionWriter() if layerwise else PredictionWriter())
            if self.config_init["predict"].get("return_predictions") is None:  # the file holds them; don't keep two
                self.config_init["predict"]["return_predictions"] = False
        return trainer

    def _resolve_last_checkpoint(self) -> None:
        """``--ckpt_path last`` becomes the newest ``last.ckpt`` of this recipe's earlier runs, refused if another
        module class wrote it (LightningCLI passes ``config_init``'s ``ckpt_path`` to the subcommand after its
        ``before_*`` hook)."""
        config = self.config_init[self.subcommand]
        if config.get("ckpt_path") == "last":
            config["ckpt_path"] = path = find_last_checkpoint(self.trainer)
            check_checkpoint_class(f"last ({path})", saved_class_path(path), self.config[self.subcommand].get("model.class_path"))
        if config.get("ckpt_path") and os.path.isfile(config["ckpt_path"]):  # damaged, or weights of another shape
            from lightning_zerocopy.checkpoint_checks import check_checkpoint_fits

            check_checkpoint_fits(config["ckpt_path"], self.model)

    before_fit = before_validate = before_test = _resolve_last_checkpoint

    def before_predict(self) -> None:
        """``--ckpt_path last`` as for the other subcommands; a module without ``predict_step`` whose ``forward``
        does not take the batch gets a clear message (not Lightning's ``forward() missing ... 'edge_index'``), except
        under ``predict_mode: layerwise``, which never calls ``predict_step``."""
        self._resolve_last_checkpoint()
        module = type(self.model)
        if getattr(self.datamodule, "predict_mode", None) == "layerwise":  # runs layerwise_step, never predict_step
            return
        if module.predict_step is not LightningModule.predict_step:
            return
        required = [
            p
            for p in list(inspect.signature(self.model.forward).parameters.values())
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(required) > 1:
            raise CommandError(
                f"{module.__module__}.{module.__qualname__} has no predict_step, and Lightning's default one calls "
                f"forward(batch), but its forward takes ({', '.join(p.name for p in required)}). Define "
                f"{predict_step_hint(self.datamodule)}."
            )


def build_cli(args: ArgsType = None, run: bool = True) -> ZeroCopyCLI:
    """Parse ``args`` (default ``sys.argv[1:]``), instantiate data, model and trainer, and run the subcommand.

    Raises :class:`CommandError` for a user error found before the run starts (``main`` prints it).

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
        seed_everything_default=0,  # what `true` gives anyway, without Lightning's "No seed found" warning
        auto_configure_optimizers=False,
        parser_class=ZeroCopyArgumentParser,
        parser_kwargs={
            "description": DESCRIPTION,
            "prog": "lightning-zerocopy",
            "formatter_class": _RawDescriptionFormatter,
        },
    )


def _import_from_the_current_folder() -> None:
    """Put the current folder first on ``sys.path``, as ``python -m lightning_zerocopy`` does, so that a recipe's
    ``class_path`` may name a module there (``mymod.MyGNN``) under the ``lightning-zerocopy`` console script too,
    whose ``sys.path`` starts with the script's own folder instead."""
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):  # "" is the current folder too
        sys.path.insert(0, cwd)


def main(args: ArgsType = None) -> None:
    """Entry point of the ``lightning-zerocopy`` console script and of ``python -m lightning_zerocopy``.

    Starts the MPS daemon first when the recipe asks for it (see the module docstring), then runs LightningCLI.
    A :class:`CommandError`, or an ``InputDataError`` raised while the subcommand ran (the dataset's content), is
    printed as one line (exit status 2); so is another rank's or the pipeline worker's death (exit status 1); a run
    stopped by Ctrl-C exits with status 130, one stopped by SIGTERM with 143 after saving the current step
    (:mod:`lightning_zerocopy.preemption`). ``LZC_TRACEBACK=1`` raises the error instead.
    """
    _import_from_the_current_folder()
    if args is None:
        argv: Optional[list[str]] = sys.argv[1:]
    elif isinstance(args, (list, tuple)):
        argv = [str(a) for a in args]
    else:  # a dict or Namespace: no recipe files to read
        argv = None
    worker_percent = mps_requested_by(argv) if argv is not None else None
    if worker_percent is not None:  # before build_cli imports the DataModule, the model and PyG
        from lightning_zerocopy.pipeline.mps_launcher import start_for_trainer

        # a DDP rank re-running this command joins its parent's daemon
        start_for_trainer(worker_percent, trainer_share_requested_by(argv))
    _watch_the_launch()
    from lightning_zerocopy import preemption

    preemption.install()  # SIGTERM: a checkpoint of the current step, then exit status 143 (preemption.py)
    try:
        cli = build_cli(args)
    except SystemExit as exc:
        # Lightning ends a run stopped by Ctrl-C with exit(1), raised while it handles the KeyboardInterrupt
        if exc.code == 1 and isinstance(exc.__context__, KeyboardInterrupt):
            raise SystemExit(INTERRUPTED_EXIT) from None
        preemption.exit_if_preempted(exc)
        raise
    except Exception as exc:
        if traceback_requested():
            raise
        preemption.exit_if_preempted(exc)
        _note_error_line()
        if isinstance(exc, CommandError) or _is_input_data_error(exc):
            sys.stderr.write(f"error: {exc}\n({TRACEBACK_ENV}=1 shows the full traceback)\n")
            raise SystemExit(2) from None
        if _is_run_fault(exc):  # another rank or the pipeline worker died: say which, once a job, without a traceback
            from lightning_zerocopy.strategies.error_line import write_fault_line  # (imported by _is_run_fault)

            write_fault_line(exc, f"({TRACEBACK_ENV}=1 shows the full traceback)")
            raise SystemExit(1) from None
        raise
    preemption.RECORD.stopping = True  # the run finished: a SIGTERM from now on is only noted
    release_the_run(cli)


def _note_error_line() -> None:
    """Tell the rank-liveness watch (if this run has one) that the run's error is being written: should it still have
    to end this process, it adds no second error line."""
    liveness = sys.modules.get("lightning_zerocopy.strategies.liveness")  # no watch runs if it was never imported
    if liveness is not None:
        liveness.error_line_written()


#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports a process that SIGINT ended).
INTERRUPTED_EXIT = 130


def _watch_the_launch() -> None:
    """A rank started by a launcher stops if the launcher dies, from now on (during the rendezvous too); a process
    that may launch ranks (Lightning's launcher re-runs this command per local rank) tells them its pid first."""
    from lightning_zerocopy.strategies.liveness import LAUNCHER_ENV
    from lightning_zerocopy.strategies.liveness_lifecycle import launch_watch

    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None:
        os.environ[LAUNCHER_ENV] = str(os.getpid())
        return
    rank = os.environ.get("RANK", local_rank)
    launch_watch(int(rank) if rank.isdigit() else 0)


def _is_run_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says that another process of the run died (a rank, the pipeline worker): its message names it
    and why; a traceback adds nothing."""
    from lightning_zerocopy.pipeline.client import PipelineError
    from lightning_zerocopy.strategies.exit_notes import caused_by_a_peer

    return caused_by_a_peer(exc) or isinstance(exc, PipelineError)


def release_the_run(cli: object) -> None:
    """Free what the finished run still holds, before the interpreter's teardown.

    The trainer, its strategy, the DataModule and the last batches sit in reference cycles, which Python need not
    free before the process exits, and jsonargparse's parser state (its context variables) keeps the parser's
    instantiators, and through them ``cli``, alive until then. Among what they hold are GPU buffers that other
    processes mapped (the pipeline's slots, the cache shard) and host registrations, which are better released
    by their owners' ``close`` while the interpreter and the CUDA runtime are intact than in the runtime's own
    teardown. So ``cli`` lets go of the run first, and collecting the cycles frees it.
    """
    import gc

    getattr(cli, "__dict__", {}).clear()  # (a test may stand in something else for the CLI)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.ipc_collect()  # anything a user's code shared through torch.multiprocessing


def _is_input_data_error(exc: BaseException) -> bool:
    """Bad data (``InputDataError``), or settings that do not fit together (``RecipeError``), found while the run
    started: the user's to fix, so one line, not a traceback."""
    # imported here: the module must not load the datasets (and torch) before MPS is started in main
    from lightning_zerocopy.datasets.base import InputDataError
    from lightning_zerocopy.options import RecipeError, RunEnvironmentError

    return isinstance(exc, (InputDataError, RecipeError, RunEnvironmentError))  # (/dev/shm too small, a full disk...)
