"""The folders a run writes to, checked before the run starts: a file where a folder should be, a folder that cannot
be created or written (read-only, another user's), each named in one line with the key that chose it.

Without this, ``trainer.default_root_dir`` naming a file failed after the data was built, with fsspec's
``NotADirectoryError`` traceback, and ``predict`` into a folder it could not write failed only after every prediction
was made.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any, Union

from lightning_zerocopy.options import RunEnvironmentError

__all__ = ["check_output_folder", "check_run_outputs"]


def check_output_folder(path: Union[str, os.PathLike], key: str) -> Path:
    """Create ``path`` if needed and prove it writable (a probe file is created and removed).

    Args:
        key: what chose the folder, for the message (e.g. ``trainer.default_root_dir``).

    Raises:
        RunEnvironmentError: one line naming ``key``, the folder and why.
    """
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise RunEnvironmentError(errno.ENOTDIR, f"{key} {folder} is a file, not a folder: name a folder (the run "
                                                 "writes its logs, checkpoints or predictions there)")  # fmt: skip
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".lzc-write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or exc
        raise RunEnvironmentError(exc.errno or errno.EACCES, f"{key} {folder} cannot be written ({why}): name a folder "
                                  "this user can create and write") from None  # (the cause: in the line)
    return folder


def check_run_outputs(trainer: Any, subcommand: str) -> None:
    """Check the folders ``trainer`` will write to in ``subcommand``: ``default_root_dir`` when a logger, a checkpoint
    callback or ``predict`` writes there, each logger's own ``save_dir`` and each checkpoint callback's own
    ``dirpath``."""
    root = trainer.default_root_dir
    if trainer.loggers or trainer.checkpoint_callbacks or subcommand == "predict":
        check_output_folder(root, "trainer.default_root_dir")
    for logger in trainer.loggers:
        save_dir = getattr(logger, "save_dir", None)
        if save_dir and os.path.abspath(save_dir) != os.path.abspath(root):
            check_output_folder(save_dir, f"the {type(logger).__name__}'s save_dir")
    for callback in trainer.checkpoint_callbacks if subcommand == "fit" else ():
        dirpath = getattr(callback, "dirpath", None)
        if dirpath:
            check_output_folder(dirpath, f"the {type(callback).__name__}'s dirpath")
