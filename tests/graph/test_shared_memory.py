"""Shared host tensors across real processes (spawn): visibility both ways, unlink lifecycle, crash cleanup."""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
import warnings

import numpy as np
import pytest
import torch

from lightning_zerocopy.graph import (
    NpyTensorHandle,
    SharedTensorHandle,
    cleanup_stale_segments,
    create_shared_tensor,
    mapped_footprint,
    open_npy_memmap,
    save_npy,
    share_tensor,
    shared_memory_dir,
)

SPAWN = mp.get_context("spawn")
TIMEOUT = 60


# ---- children (module level so that spawn can import them) ----------------------------------------------------


def _child_read_then_write(handle: SharedTensorHandle, to_parent, from_parent) -> None:
    t = handle.open()
    to_parent.put(t.numpy().copy())  # by value: what the parent wrote
    t[0].fill_(-7.5)  # the parent must see this
    to_parent.put("written")
    from_parent.get()  # parent unlinked the name: the mapping must still work
    to_parent.put(t[1].numpy().copy())


def _child_create_and_hang(to_parent) -> None:
    t, handle = create_shared_tensor((1000,), torch.float32, name="orphan")
    t.fill_(1.0)
    to_parent.put(handle)
    signal.pause()


def _child_open_and_hang(handle: SharedTensorHandle, to_parent) -> None:
    t = handle.open()
    to_parent.put(float(t.sum()))
    signal.pause()


def _child_open_npy(handle: NpyTensorHandle, to_parent) -> None:
    t = handle.open()
    to_parent.put(t.view(torch.int16 if t.dtype == torch.bfloat16 else t.dtype).numpy().copy())


# ---- tests ------------------------------------------------------------------------------------------------------


def _own_segments() -> list[str]:
    return glob.glob(os.path.join(shared_memory_dir(), f"lzc-{os.getpid()}-*"))


def test_two_processes_see_each_others_writes_and_unlink_frees_the_name():
    x = torch.randn(64, 33)
    shared, handle = share_tensor(x, name="rw")
    assert torch.equal(shared, x) and os.path.exists(handle.path)
    handle = pickle.loads(pickle.dumps(handle))  # what another process receives
    to_parent, from_parent = SPAWN.Queue(), SPAWN.Queue()
    child = SPAWN.Process(target=_child_read_then_write, args=(handle, to_parent, from_parent))
    child.start()
    try:
        assert torch.equal(torch.from_numpy(to_parent.get(timeout=TIMEOUT)), x)
        assert to_parent.get(timeout=TIMEOUT) == "written"
        assert bool((shared[0] == -7.5).all()) and torch.equal(shared[1:], x[1:])
        handle.unlink()  # everyone has mapped it: drop the name
        assert not os.path.exists(handle.path)
        shared[1].fill_(3.25)  # still shared after unlink
        from_parent.put("go")
        assert (to_parent.get(timeout=TIMEOUT) == 3.25).all()
        child.join(TIMEOUT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
        handle.unlink()
    assert _own_segments() == []
    with pytest.raises(FileNotFoundError, match="unlinked"):
        handle.open()


def test_killed_creator_segment_is_cleaned_up():
    to_parent = SPAWN.Queue()
    child = SPAWN.Process(target=_child_create_and_hang, args=(to_parent,))
    child.start()
    try:
        handle = to_parent.get(timeout=TIMEOUT)
        assert f"lzc-{child.pid}-" in os.path.basename(handle.path) and handle.exists()
        assert handle.path not in cleanup_stale_segments()  # creator alive: kept
        assert handle.exists()
    finally:
        child.kill()
        child.join(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT  # its guardian unlinks it (tests/graph/test_segment_guardian.py)
    while handle.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle.exists()


def test_cleanup_removes_the_segments_of_dead_creators_only(tmp_path):
    """The fallback for a creator whose guardian was killed too: names carry the creator's pid."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"lzc-{int(dead.stdout)}-{uuid.uuid4().hex}-x"
    alive = tmp_path / f"lzc-{os.getpid()}-{uuid.uuid4().hex}-y"
    other = tmp_path / "lzc-notours"
    for path in (stale, alive, other):
        path.write_bytes(b"0")
    assert cleanup_stale_segments(tmp_path) == [str(stale)]
    assert alive.exists() and other.exists() and not stale.exists()


def test_killed_reader_does_not_block_unlink():
    shared, handle = create_shared_tensor((256,), torch.float64, name="reader")
    shared.copy_(torch.rand(256, dtype=torch.float64))
    to_parent = SPAWN.Queue()
    child = SPAWN.Process(target=_child_open_and_hang, args=(handle, to_parent))
    child.start()
    try:
        assert to_parent.get(timeout=TIMEOUT) == pytest.approx(float(shared.sum()))
    finally:
        child.kill()
        child.join(TIMEOUT)
    assert child.exitcode == -signal.SIGKILL
    handle.unlink(missing_ok=False)
    assert _own_segments() == []


def test_cleanup_ignores_live_and_foreign_files(tmp_path):
    live, live_handle = create_shared_tensor((3,), torch.int32, name="live", directory=tmp_path)
    foreign = tmp_path / "not-ours.bin"
    foreign.write_bytes(b"x")
    dead_pid = 2**22 + 12345  # above the default pid_max of most systems
    stale = tmp_path / f"lzc-{dead_pid}-{'ab' * 16}-old"
    stale.write_bytes(b"x")
    assert cleanup_stale_segments(tmp_path) == [str(stale)]
    assert live_handle.exists() and foreign.exists()
    live_handle.unlink()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_create_open_roundtrip_dtypes(dtype, tmp_path):
    t, handle = create_shared_tensor((5, 7), dtype, directory=tmp_path)
    t.copy_(torch.randint(0, 2 if dtype == torch.bool else 100, (5, 7)).to(dtype))
    again = pickle.loads(pickle.dumps(handle)).open()
    assert again.dtype == dtype and again.shape == (5, 7) and torch.equal(again, t)
    assert handle.nbytes == 35 * t.element_size()
    handle.unlink()


def test_share_non_contiguous_and_empty(tmp_path):
    x = torch.randn(10, 6).t()
    shared, handle = share_tensor(x, directory=tmp_path)
    assert shared.is_contiguous() and torch.equal(shared, x)
    handle.unlink()
    shared, handle = share_tensor(torch.empty(0, 4), directory=tmp_path)
    assert handle.open().shape == (0, 4)
    handle.unlink()


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`name`"):
        create_shared_tensor((2,), torch.float32, name="../escape", directory=tmp_path)
    with pytest.raises(ValueError, match="`shape`"):
        create_shared_tensor((2, -1), torch.float32, directory=tmp_path)
    with pytest.raises(ValueError, match="`tensor`"):
        share_tensor(torch.empty(2, device="meta"), directory=tmp_path)


def test_directory_from_environment(tmp_path, monkeypatch):
    (tmp_path / "shm").mkdir()  # it must exist (tests/graph/test_shm_dir.py); on disk here: a warning says so
    monkeypatch.setenv("LZC_SHM_DIR", str(tmp_path / "shm"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t, handle = create_shared_tensor((4,), torch.float32, name="env")
    assert os.path.dirname(handle.path) == str(tmp_path / "shm")
    handle.unlink()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_npy_memmap_roundtrip_is_copy_on_write(dtype, tmp_path):
    x = torch.randn(50, 9).to(dtype)
    handle = pickle.loads(pickle.dumps(save_npy(x, tmp_path / "x.npy")))
    t = handle.open()
    assert t.dtype == dtype and torch.equal(t, x)
    assert handle.nbytes == x.numel() * x.element_size()  # as a SharedTensorHandle's: the data, not the file
    t[0].fill_(0)  # copy-on-write: private to this process, the file is unchanged
    assert torch.equal(handle.open(), x)


def test_npy_memmap_opens_in_another_process(tmp_path):
    x = torch.randn(40, 3).to(torch.bfloat16)
    handle = save_npy(x, tmp_path / "x.npy")
    to_parent = SPAWN.Queue()
    child = SPAWN.Process(target=_child_open_npy, args=(handle, to_parent))
    child.start()
    try:
        assert torch.equal(torch.from_numpy(to_parent.get(timeout=TIMEOUT)).view(torch.bfloat16), x)
    finally:
        child.join(TIMEOUT)
    assert child.exitcode == 0


def test_open_npy_memmap_dtype_checks(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.int16).reshape(3, 4))
    assert open_npy_memmap(tmp_path / "a.npy", dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="`dtype`"):
        open_npy_memmap(tmp_path / "a.npy", dtype=torch.float32)
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((3, 4), dtype=np.float32)))
    with pytest.raises(ValueError, match="C-ordered"):
        open_npy_memmap(tmp_path / "f.npy")


# ---- mapped_footprint: PSS splits a shared page between the processes that map it ------------------------------
_TOUCH_AND_WAIT = """
import pickle, sys
handle = pickle.loads(bytes.fromhex(sys.argv[1]))
t = handle.open()
float(t.sum())  # every page resident in this process too
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="PSS comes from /proc/self/smaps (Linux)")
def test_mapped_footprint_splits_pss_between_processes_that_map_a_segment(tmp_path) -> None:
    import subprocess
    import sys

    tensor, handle = create_shared_tensor((1 << 20,), torch.float32, name="pss", directory=tmp_path)  # 4 MiB
    try:
        tensor.fill_(1.0)
        pss, rss = mapped_footprint([handle.path])
        assert rss >= handle.nbytes and abs(pss - rss) < 64 * 1024, (pss, rss)  # only this process maps it
        child = subprocess.Popen([sys.executable, "-c", _TOUCH_AND_WAIT, pickle.dumps(handle).hex()],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert child.stdout.readline().strip() == "ready"
            shared_pss, shared_rss = mapped_footprint([handle.path])
            assert shared_rss == rss  # RSS counts the whole copy in each process
            assert abs(shared_pss - rss / 2) < 64 * 1024, (shared_pss, rss)  # PSS: half of it each
        finally:
            child.communicate(input="", timeout=TIMEOUT)
        assert mapped_footprint([str(tmp_path / "not-mapped")]) == (0, 0)
    finally:
        handle.unlink()
