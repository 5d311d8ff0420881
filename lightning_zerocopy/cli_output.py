"""What a normal run of the ``lightning-zerocopy`` command prints: progress and figures, not notices to ignore.

Lightning prints some on every run that say nothing about the user's run. Each is removed here by its own message,
so every other warning still shows:

* ``💡 Tip: ... litlogger`` / ``litmodels`` (advertising, logged at INFO by Lightning's rank-zero logger);
* ``isinstance(treespec, LeafSpec)`` is deprecated (torch's ``FutureWarning`` about Lightning's own code, printed
  at every evaluation);
* ``The dirpath has changed from ...`` on ``validate``/``test``/``predict`` with a checkpoint: such a run writes to
  a new version folder, so the ``ModelCheckpoint`` state of the training run is not restored, which is what these
  subcommands want.

The notice that ``tensorboardX`` is not a dependency any more is avoided, not filtered: the command names the logger
Lightning would pick (:func:`~lightning_zerocopy.cli_runs.default_logger`).
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_lightning_notices"]

_TIP = "💡 Tip:"
_EVALUATION = ("validate", "test", "predict")


class _DropTips(logging.Filter):
    """Drops Lightning's "💡 Tip" lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TIP)


def quiet_lightning_notices(subcommand: "str | None") -> None:
    """Install the filters of the module docstring (once per process; the ``dirpath`` one for ``subcommand`` in
    ``validate``/``test``/``predict``)."""
    from lightning_utilities.core import rank_zero

    logger = rank_zero.log  # the logger Lightning's rank_zero_info writes to (pytorch_lightning's, once imported)
    if not any(isinstance(f, _DropTips) for f in logger.filters):
        logger.addFilter(_DropTips())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    if subcommand in _EVALUATION:
        warnings.filterwarnings("ignore", message="The dirpath has changed from ")
