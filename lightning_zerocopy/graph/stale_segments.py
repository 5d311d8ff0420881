"""Removing the shared segments of dead creators, on a machine other users and crashed runs share.

Segment names carry their creator's pid (``lzc-<pid>-<uuid>[-name]``, :mod:`~lightning_zerocopy.graph.shared_memory`),
so a job can remove, before it creates its own, what a creator killed together with its guardian left behind. A
segment this user may not remove (another user's in a sticky ``/dev/shm``) is skipped with one warning naming it:
it must never fail the run.
"""

from __future__ import annotations

import os
import warnings
from typing import Union

from lightning_zerocopy.graph.shared_memory import SEGMENT_RE, shared_memory_dir
from lightning_zerocopy.process_state import process_alive

__all__ = ["cleanup_stale_segments"]

_warned: set[str] = set()  # paths already named in a warning by this process


def cleanup_stale_segments(directory: Union[str, os.PathLike, None] = None) -> list[str]:
    """Unlink the segments whose creator process is no longer alive.

    Only files named ``lzc-<pid>-<uuid>[-name]`` are considered. A creator is judged by its pid on this machine (and
    pid namespace); call this at job start, before creating segments. One this process may not remove is skipped,
    with one warning (per process) naming those skipped.

    Returns:
        The paths removed.
    """
    root = shared_memory_dir(directory)
    removed, skipped = [], []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = SEGMENT_RE.match(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False) or process_alive(int(match.group(1))):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:  # another process cleaned it concurrently
            continue
        except OSError as exc:  # another user's, in a sticky folder: not ours to remove
            if entry.path not in _warned:
                skipped.append(f"{entry.path} ({exc.strerror or exc})")
                _warned.add(entry.path)
            continue
        removed.append(entry.path)
    if skipped:
        shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        warnings.warn(f"stale shared-memory segments of dead processes that this user cannot remove were skipped: "
                      f"{shown} (their owner or root can delete them)", UserWarning, stacklevel=2)  # fmt: skip
    return removed
