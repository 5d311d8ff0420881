"""GPU memory shared by bare CUDA IPC memory handles: export, open in another process (on the same GPU and for a
peer GPU that reads the memory over the peer link). What a killed exporter leaves under /dev/shm is checked by the
two-GPU fault tests (tests/test_faults_two_gpus.py) and the guardian's tests."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.multiprocessing as mp

from lightning_zerocopy import ops
from lightning_zerocopy.graph.cuda_ipc import CudaTensorHandle, export_cuda_tensor


def test_export_refuses_a_cpu_tensor():
    with pytest.raises(ValueError, match="CUDA tensor"):
        export_cuda_tensor(torch.zeros(3))


@pytest.mark.skipif(ops.WITH_CUDA, reason="checks the CPU build's message")
def test_the_ops_say_the_build_has_no_cuda():
    with pytest.raises(RuntimeError, match="built without its CUDA kernels"):
        ops.cuda_ipc_open(b"\0" * 66, 0, 4, torch.device("cuda", 0))


def test_a_handle_is_picklable_and_names_its_shape():
    handle = CudaTensorHandle(shape=(4, 3), dtype=torch.bfloat16, device_index=0, device_uuid="GPU-x", owner_pid=1,
                              key="k", ipc=b"\1" * 66, offset=512)  # fmt: skip
    again = pickle.loads(pickle.dumps(handle))
    assert again == handle and again.ipc == handle.ipc
    assert (again.numel, again.nbytes) == (12, 24)


def _child(handle: CudaTensorHandle, device: str, queue) -> None:
    try:
        t = handle.open(device)
        doubled = (t.float() * 2).cpu()  # a kernel of `device` reads the memory
        t.add_(1)  # and writes it: the exporter sees the change
        torch.cuda.synchronize(device)
        queue.put(("ok", doubled.numpy(), str(t.device)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(exc), None))


def _open_in_child(handle: CudaTensorHandle, device: str):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(handle, device, queue))
    proc.start()
    try:
        result = queue.get(timeout=120)
    finally:
        proc.join(timeout=60)
    assert result[0] == "ok", result[1]
    assert proc.exitcode == 0
    return torch.from_numpy(result[1]), result[2]


@pytest.mark.cuda
def test_a_spawned_process_reads_and_writes_an_exported_tensor():
    base = torch.randn(1000, 17, device="cuda:0")
    tensor = base[10:20]  # a view into a larger allocation: the offset is carried
    expected = (tensor.float() * 2).cpu()
    handle = export_cuda_tensor(tensor)
    assert handle.offset > 0
    doubled, device = _open_in_child(handle, "cuda:0")
    assert torch.equal(doubled, expected) and device == "cuda:0"
    torch.cuda.synchronize()
    assert torch.equal((tensor.float() * 2).cpu(), expected + 2)  # the child's add_ landed here
    assert handle.open() is tensor  # the exporter gets its own tensor back


@pytest.mark.two_gpus
def test_a_peer_gpu_reads_memory_opened_for_it():
    """Memory on GPU 0, opened in another process for GPU 1: kernels of GPU 1 read and write it over the peer link.
    Opened in GPU 0's context instead (as torch's rebuild_cuda_tensor does), GPU 1's kernels fault with an illegal
    address."""
    tensor = torch.randn(4096, 64, device="cuda:0")
    expected = (tensor * 2).cpu()
    handle = export_cuda_tensor(tensor)
    assert handle.lives_on(torch.device("cuda", 0)) and not handle.lives_on(torch.device("cuda", 1))
    doubled, device = _open_in_child(handle, "cuda:1")
    assert device == "cuda:1" and torch.equal(doubled, expected)
    torch.cuda.synchronize()
    assert torch.equal((tensor * 2).cpu(), expected + 2)
