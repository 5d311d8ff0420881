"""A graph saved with ``torch.save``, given by path: its argument type, and loading it with a progress bar.

**The type.** A dataset argument that takes a PyG object *or* its file (``Union[Data, Dataset, str]``) made
jsonargparse read the file: for an argument whose type includes a class, it tries a string that names an existing file
as a config file for that class, reads it whole as text (a ``UnicodeDecodeError`` for a saved graph), and does so for
every class of the union and every parsing pass (40 reads of one file for one ``fit``; minutes for a 6.8 GB graph).
:data:`GraphFile` puts ``pathlib.Path``, an ``os.PathLike``, in the union: jsonargparse then takes a string given for
the argument as a path and reads nothing (its ``ActionTypeHint`` turns config-file loading off for a path-like type).

**The load.** :func:`load_saved_graph` reads the file through a reader that moves a byte progress bar (shown for loads
longer than a second), in chunks, into the buffers ``torch.load`` hands it: no copy more than ``torch.load`` of the
path makes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import torch

from lightning_zerocopy.datasets.base import DatasetFileError, progress_bar

__all__ = ["GraphFile", "load_saved_graph"]

#: The file of a graph saved with ``torch.save``: a ``str`` or a ``pathlib.Path`` (see the module docstring for why an
#: argument's type names ``Path``).
GraphFile = Union[str, Path]

_CHUNK = 64 << 20  # bytes per read: the bar moves at least every 64 MiB


class _ProgressReader:
    """A binary file whose reads move a progress bar; ``torch.load`` takes it as a file-like object."""

    def __init__(self, file: Any, bar: Any) -> None:
        self._file, self._bar = file, bar

    def _advance(self, count: int) -> None:
        """Moves the bar by ``count`` bytes, up to the file's size (a few bytes, zip headers, are read twice)."""
        self._bar.update(max(0, min(count, self._bar.total - self._bar.n)))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view):
            count = self._file.readinto(view[done : done + _CHUNK])
            if not count:
                break
            done += count
            self._advance(count)
        return done

    def read(self, size: Optional[int] = -1) -> bytes:
        data = self._file.read(size)
        self._advance(len(data))
        return data

    def readline(self, size: Optional[int] = -1) -> bytes:
        line = self._file.readline(size)
        self._advance(len(line))
        return line

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def load_saved_graph(path: Path, accepted: str) -> Any:
    """The object saved in ``path`` with ``torch.save`` (``weights_only=False``: a PyG object is not plain tensors).

    Args:
        path: the file.
        accepted: what the argument takes, for the message when the file is missing (e.g. "a PyG Data object").

    Raises:
        FileNotFoundError: no such file.
        DatasetFileError: the file cannot be unpickled (damaged, or not written by ``torch.save``).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: `data` must be {accepted} or the path of one saved with torch.save")
    try:
        with open(path, "rb") as file, progress_bar(path.stat().st_size, f"torch.load {path.name}", "B") as bar:
            return torch.load(_ProgressReader(file, bar), weights_only=False)
    except Exception as exc:  # a damaged or foreign file: unpickling raises many kinds of errors
        raise DatasetFileError(path, f"cannot be loaded with torch.load ({type(exc).__name__}: {exc})") from exc
