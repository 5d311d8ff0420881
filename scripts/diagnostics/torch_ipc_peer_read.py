"""Why shards are opened for the GPU that reads them (run on a machine with two peer-connected GPUs).

A parent process puts a tensor on GPU 0 and shares it; a spawned child reads it with a kernel of GPU 1:

* ``torch``: the tensor goes through torch.multiprocessing (``reduce_tensor`` / ``rebuild_cuda_tensor``), which maps
  it in GPU 0's context in the child; GPU 1's kernel reading it faults (cudaErrorIllegalAddress), even with peer
  access enabled from GPU 1 to GPU 0 first.
* ``ours``: the tensor goes as a bare CUDA IPC memory handle (``lightning_zerocopy.graph.cuda_ipc``), opened in GPU
  1's context with lazy peer access; GPU 1's kernel reads it.

    python scripts/diagnostics/torch_ipc_peer_read.py      # prints one line per path
"""

from __future__ import annotations

import sys

import torch
import torch.multiprocessing as mp


def _read_torch(args, queue) -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        tensor = rebuild_cuda_tensor(*args)  # mapped in the owner GPU's (cuda:0's) context
        torch.cuda.set_device(1)
        torch.cuda.synchronize(1)
        from lightning_zerocopy import ops

        n = tensor.shape[0]
        ids = torch.arange(n, device="cuda:1")
        out = torch.empty((n, tensor.shape[1]), device="cuda:1")
        # the cache's gather kernel on GPU 1, every row from the shard (what the clique cache did with a peer shard)
        location = torch.arange(n, dtype=torch.int32, device="cuda:1")  # row i -> segment 0, slot i
        ops.gather_segmented(torch.zeros(n, tensor.shape[1], device="cuda:1"), ids, location, 31, [tensor], out=out)
        torch.cuda.synchronize(1)
        queue.put(("read", float(out.double().sum())))
    except BaseException as exc:  # noqa: BLE001
        queue.put(("failed", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))


def _read_ours(handle, queue) -> None:
    try:
        tensor = handle.open(torch.device("cuda", 1))  # mapped in cuda:1's context, peer access on the way
        queue.put(("read", float((tensor.double() * 1).sum().item())))
    except BaseException as exc:  # noqa: BLE001
        queue.put(("failed", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))


def _child(target, arg) -> tuple[str, str, int]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(arg, queue))
    proc.start()
    kind, value = "died", ""
    for _ in range(600):  # up to 60 s, but no longer than the child lives
        try:
            kind, value = queue.get(timeout=0.1)
            break
        except Exception:  # noqa: BLE001 - nothing yet
            if not proc.is_alive():
                break
    proc.join(30)
    return kind, str(value), proc.exitcode


def main() -> int:
    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(1, 0):
        print("needs two GPUs with peer access")
        return 2
    tensor = torch.randn(4096, 64, device="cuda:0")
    expected = float(tensor.double().sum())
    from torch.multiprocessing.reductions import reduce_tensor

    from lightning_zerocopy.graph.cuda_ipc import export_cuda_tensor

    print(f"expected sum {expected:.4f}")
    print("torch IPC, read by GPU 1:", _child(_read_torch, reduce_tensor(tensor)[1]))
    print("bare handle opened for GPU 1, read by GPU 1:", _child(_read_ours, export_cuda_tensor(tensor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
