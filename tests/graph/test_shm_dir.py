"""Where segments live (``graph/shm_dir.py``): ``LZC_SHM_DIR`` naming no folder is refused (it was created on disk
without a word), one not in memory is a warning, and a folder too small for a segment is one line with the bytes
needed, the bytes free and the fix (it was a traceback)."""

from __future__ import annotations

import errno
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from lightning_zerocopy.graph.shared_memory import create_shared_tensor
from lightning_zerocopy.graph.shm_dir import (
    SHM_DIR_ENV,
    HostMemoryError,
    SharedMemoryFullError,
    filesystem_type,
    shared_memory_dir,
)


def test_a_shm_dir_that_does_not_exist_is_refused_and_not_created(tmp_path, monkeypatch) -> None:
    missing = tmp_path / "no" / "such"
    monkeypatch.setenv(SHM_DIR_ENV, str(missing))
    with pytest.raises(HostMemoryError) as info:
        shared_memory_dir()
    assert str(info.value).startswith(f"{SHM_DIR_ENV}={missing} is not a directory") and "\n" not in str(info.value)
    assert not missing.exists()


@pytest.mark.skipif(filesystem_type("/dev/shm") != "tmpfs", reason="needs /dev/shm on tmpfs")
def test_a_shm_dir_on_disk_is_a_warning_and_a_memory_backed_one_is_not(tmp_path, monkeypatch) -> None:
    if filesystem_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("the test folder is in memory here")
    monkeypatch.setenv(SHM_DIR_ENV, str(tmp_path))
    with pytest.warns(UserWarning, match=f"{SHM_DIR_ENV}={tmp_path} is on a .* filesystem, not in memory"):
        assert shared_memory_dir() == tmp_path
    monkeypatch.setenv(SHM_DIR_ENV, "/dev/shm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shared_memory_dir() == Path("/dev/shm")


def _tiny_tmpfs(path: Path) -> bool:
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True).returncode == 0


def test_a_full_shm_dir_is_one_line_with_bytes_needed_and_free(tmp_path, monkeypatch) -> None:
    tiny = tmp_path / "tiny"
    mounted = os.geteuid() == 0 and _tiny_tmpfs(tiny)
    if not mounted:  # no tmpfs of our own: a full one as posix_fallocate reports it
        tiny.mkdir(exist_ok=True)

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
    monkeypatch.setenv(SHM_DIR_ENV, str(tiny))
    try:
        with pytest.raises(SharedMemoryFullError) as info:
            create_shared_tensor((2**20,), torch.float32, name="features")
        message = str(info.value)
        assert message.startswith("shared memory is full: features of the host copy needs 4,194,304 bytes (4.00 MiB)")
        assert f"in {tiny}, which has" in message and "bytes" in message.split("which has")[1] and "\n" not in message
        assert f"set {SHM_DIR_ENV} to a larger memory-backed folder" in message
        assert not [n for n in os.listdir(tiny) if n.startswith("lzc-")]  # nothing left behind
    finally:
        if mounted:
            subprocess.run(["umount", str(tiny)], check=False)
