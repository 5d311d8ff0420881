"""Helpers shared by test files of several directories (``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import mmap
import os
import pathlib
import signal
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from pytorch_lightning.callbacks import Callback

if TYPE_CHECKING:
    from lightning_zerocopy.datasets.base import NodeData


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts: it runs nothing and holds no GPU context)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


def wait_process_gone(pid: int, timeout: float) -> bool:
    """Poll :func:`process_gone` for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.05)
    return process_gone(pid)


def kill_if_running(*pids: Optional[int]) -> None:
    """SIGKILL each of ``pids`` (``None`` or 0 skipped) that :func:`process_gone` says still runs: the cleanup of a
    test that may have left a process behind."""
    for pid in pids:
        if pid and not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


def sigint_at_default() -> None:
    """``preexec_fn`` of a child process a test interrupts with SIGINT (Ctrl-C): the child starts with SIGINT at its
    default disposition, whatever the test process inherited. A shell starts a background job (``cmd &`` in a
    script) with SIGINT ignored, an ignored signal stays ignored across ``exec``, and Python then installs no
    KeyboardInterrupt handler: the signal would do nothing and the test would measure how the suite was launched."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_ready_line(proc: subprocess.Popen, timeout: float) -> Optional[str]:
    """The first stdout line of ``proc`` that starts with ``READY``, or ``None`` if it exits or ``timeout``
    seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY"):
            return line
        if not line and proc.poll() is not None:
            return None
    return None


def exclusive_host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in its own anonymous memory mapping (like the shared-memory tables the library registers).
    Registration works on whole pages, so heap memory shared with other tensors would share registrations."""
    nbytes = t.numel() * t.element_size()
    pages = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE  # the storage spans the mapping's whole pages
    mapping = mmap.mmap(-1, pages)
    out = torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


@contextlib.contextmanager
def page_aligned_heap_bytes(nbytes: int) -> Iterator[int]:
    """The address of ``nbytes`` of heap memory (``posix_memalign``) that starts on a page boundary, freed on exit:
    what one in 64 of torch's own 64-byte-aligned heap allocations is by chance, made certain. Wrap parts of it
    with ``heap_tensor``; drop those tensors before the block ends."""
    libc = ctypes.CDLL(None)
    address = ctypes.c_void_p()
    if libc.posix_memalign(ctypes.byref(address), mmap.PAGESIZE, nbytes) != 0:
        raise MemoryError(f"posix_memalign of {nbytes} bytes failed")
    try:
        yield int(address.value)
    finally:
        libc.free(address)


def heap_tensor(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor whose storage is exactly ``[address, address + nbytes)``, as a heap allocation's would be."""
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)


#: The ``torch.library.opcheck`` tests :func:`opcheck` runs on an op of ``torch.ops.zerocopy``.
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")


def opcheck(op: Any, args: tuple) -> None:
    """``torch.library.opcheck(op, args)`` limited to :data:`OPCHECK_TESTS`: the op's schema, autograd registration
    and fake (meta) kernel on these arguments, not ``test_aot_dispatch_dynamic``, which opcheck runs by default."""
    torch.library.opcheck(op, args, test_utils=OPCHECK_TESTS)


def matmul_tflops(size: int = 8192, iters: int = 20) -> float:
    """bf16 matmul TFLOP/s of this process on its current CUDA device (random inputs, timed with events)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    end.synchronize()
    return 2 * size**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12


def random_node_data(num_nodes: int, num_edges: int, features: int, seed: int, train: int, val: int,
                     num_classes: int = 5) -> NodeData:  # fmt: skip
    """A uniform random graph as ``NodeData``: random edges, features and labels, and disjoint sorted splits
    (the first ``train`` nodes of a random permutation, the next ``val``, the rest for test)."""
    from lightning_zerocopy.datasets.base import NodeData

    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_nodes, generator=gen)
    return NodeData(
        edge_index=torch.randint(0, num_nodes, (2, num_edges), generator=gen),
        x=torch.randn(num_nodes, features, generator=gen),
        y=torch.randint(0, num_classes, (num_nodes,), generator=gen),
        train_idx=perm[:train].sort().values,
        val_idx=perm[train : train + val].sort().values,
        test_idx=perm[train + val :].sort().values,
    )


_TORCH_SPARSE_SHIM: list = []


def fake_torch_sparse_sampler() -> None:
    """``torch.ops.torch_sparse.neighbor_sample`` backed by our sampler (once per process), so PyG's
    NeighborLoader / LinkNeighborLoader sample on a machine without pyg-lib or torch-sparse (the benchmarks' PyG rows
    in CI; with ``torch_geometric.typing.WITH_TORCH_SPARSE`` and ``sys.modules["torch_sparse"]`` patched)."""
    if _TORCH_SPARSE_SHIM:
        return
    lib = torch.library.Library("torch_sparse", "DEF")
    lib.define("neighbor_sample(Tensor colptr, Tensor row, Tensor input_node, int[] num_neighbors, bool replace, "
               "bool directed) -> (Tensor, Tensor, Tensor, Tensor)")  # fmt: skip

    def neighbor_sample(colptr, row, seeds, num_neighbors, replace, directed):  # noqa: ANN001, ANN202
        n_id, src, dst, edge_pos, _, _ = torch.ops.zerocopy.sample_neighbors(colptr, row, seeds, list(num_neighbors), replace, 0)
        return n_id, src, dst, edge_pos

    lib.impl("neighbor_sample", neighbor_sample, "CPU")
    _TORCH_SPARSE_SHIM.append(lib)


class RecordBatches(Callback):
    """Keeps a clone of ``fields`` (those a batch has) of every training batch and of every validation batch after the
    sanity check, keyed by ``(epoch, batch_idx)``, and every training loss."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields
        self.train: dict[tuple[int, int], dict] = {}
        self.val: dict[tuple[int, int], dict] = {}
        self.losses: list[float] = []

    def _freeze(self, batch) -> dict:
        return {k: (batch[k].detach().clone() if isinstance(batch[k], torch.Tensor) else batch[k]) for k in self.fields if k in batch}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train[(trainer.current_epoch, batch_idx)] = self._freeze(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self.val[(trainer.current_epoch, batch_idx)] = self._freeze(batch)


class BatchList:
    """A fixed sequence of batches as one dataloader (Lightning reads a plain list as several dataloaders)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Any:
        return self.batches[i]


def _load_file(path: pathlib.Path, module_name: str) -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_test_module(beside: str, name: str) -> Any:
    """The test module ``<name>.py`` in the folder of the file ``beside`` (a test's ``__file__``), loaded afresh
    under its own name, so one test file can reuse another's helpers without packages under ``tests/``."""
    return _load_file(pathlib.Path(beside).with_name(f"{name}.py"), f"_{name}")


def load_diagnostic(name: str) -> Any:
    """``scripts/diagnostics/<name>.py``, loaded as a module (the scripts are not a package)."""
    return _load_file(pathlib.Path(__file__).parents[2] / "scripts" / "diagnostics" / f"{name}.py", name)


#: The start of the warning torch's sync debug mode ("warn") gives for each synchronizing CUDA operation.
SYNC_WARNING = "called a synchronizing CUDA operation"


def sync_warnings(records: "list[Any]") -> list[str]:
    """``file:line: message`` of each synchronizing CUDA operation among caught warnings.

    Only torch's per-operation warning counts: the first ``set_sync_debug_mode`` of a process also warns, once,
    "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations",
    which is no synchronization (matching on "synchroniz" alone failed a test that happened to run first in its
    process on an H100).
    """
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in records if str(w.message).startswith(SYNC_WARNING)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before it is bound: see
    :func:`run_single_rank_ddp`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single_rank_ddp(args: "list[str]", attempts: int = 3, env: "Optional[dict[str, str]]" = None,
                        **kwargs: Any) -> "subprocess.CompletedProcess[str]":  # fmt: skip
    """``subprocess.run(args, capture_output=True, text=True)`` for a process that starts a one-rank DDP job, with
    ``MASTER_ADDR``/``MASTER_PORT`` set to a free port, run again on a new port when the rendezvous lost the race
    for it (``EADDRINUSE``: seen under pytest-xdist, where other workers' processes pick free ports too)."""
    base = dict(os.environ if env is None else env)
    for attempt in range(attempts):
        port_env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        proc = subprocess.run(args, capture_output=True, text=True, env=port_env, **kwargs)
        if proc.returncode == 0 or "EADDRINUSE" not in proc.stderr or attempt == attempts - 1:
            break
    return proc


#: How long a fault test lets processes take to end where the product promises 10 s: loaded 2-core CI machines
#: need more (``LZC_TEST_FAULT_BOUND_S``); the GPU fault checks use 10 s.
FAULT_BOUND_S = float(os.environ.get("LZC_TEST_FAULT_BOUND_S", "45"))


def launched_ranks(pid: int, marker: str) -> list[int]:
    """The child processes of ``pid`` whose command line contains ``marker`` (the ranks it launched)."""
    found = []
    try:
        children = [int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    for child in children:
        try:
            cmdline = pathlib.Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and "--guard" not in cmdline:
            found.append(child)
    return found


