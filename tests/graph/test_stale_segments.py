"""On a shared machine, stale segments this user may not remove (another user's, in a sticky /dev/shm) are skipped
with one warning naming them; they never fail the run (a ``PermissionError`` traceback did, for every ``fit``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings

import pytest

from lightning_zerocopy.graph.stale_segments import cleanup_stale_segments


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)  # fmt: skip


def test_a_stale_segment_that_cannot_be_removed_is_skipped_with_one_warning(tmp_path, monkeypatch) -> None:
    dead = _dead_pid()
    foreign = tmp_path / f"lzc-{dead}-{uuid.uuid4().hex}-x"  # another user's: unlink refused (EPERM, sticky folder)
    ours = tmp_path / f"lzc-{dead}-{uuid.uuid4().hex}-y"
    for path in (foreign, ours):
        path.write_bytes(b"0")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.fspath(path) == str(foreign):
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.warns(UserWarning) as caught:
        assert cleanup_stale_segments(tmp_path) == [str(ours)]
    named = [str(w.message) for w in caught if str(foreign) in str(w.message)]
    assert len(named) == 1 and "Operation not permitted" in named[0] and "cannot remove" in named[0], named
    assert foreign.exists() and not ours.exists()
    with warnings.catch_warnings():  # the next job start in this process does not warn about it again
        warnings.simplefilter("error")
        assert cleanup_stale_segments(tmp_path) == []
