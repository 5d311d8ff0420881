"""The pipeline's worker process: samples and gathers batches into slots the trainer shares with it.

The worker is a ``spawn``-ed child (CUDA cannot be forked) that runs :class:`~.producer.Producer` over a
duplex pipe. Slot tensors cross the pipe once (torch.multiprocessing shares CUDA tensors over CUDA IPC and
CPU tensors as shared-memory file descriptors); afterwards only slot numbers and sizes do.

Lifecycle and faults:

* the worker ignores SIGINT (a Ctrl-C in the terminal reaches the whole process group; the trainer decides
  how to stop) and exits when told, when the pipe closes, or within half a second of its parent's death
  (a watchdog thread polls the parent pid), so it never outlives the trainer;
* the trainer notices a dead worker within ~0.2 s of waiting and raises :class:`~.client.PipelineError`
  naming the signal or exit code;
* :meth:`WorkerTransport.close` asks, then terminates, then kills, and joins.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import Mapping, Optional

import torch
import torch.multiprocessing as mp

from lightning_zerocopy.pipeline.client import PipelineError
from lightning_zerocopy.pipeline.producer import ChannelClosed, Producer


class _PipeChannel:
    """Producer end of the pipe."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def send(self, msg: tuple) -> None:
        self.conn.send(msg)

    def recv(self) -> tuple:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise ChannelClosed() from exc

    def poll(self) -> bool:
        try:
            return self.conn.poll()
        except (EOFError, OSError) as exc:
            raise ChannelClosed() from exc


def _watch_parent(parent_pid: int, period: float = 0.5) -> None:
    while True:
        time.sleep(period)
        if os.getppid() != parent_pid:
            os._exit(0)


_SPAWN_ENV_LOCK = threading.Lock()
_STARTED = ("started",)
#: How long a spawned worker may take to start its interpreter (import torch) before the trainer gives up. This
#: is not counted against the client's per-batch timeout: on a loaded machine it alone took more than 30 s.
START_TIMEOUT_S = 600.0
_DRIVER_FILES_CLEANUP = []


def _unlink_driver_ipc_files(pid: int) -> None:
    """Remove the CUDA driver's ``/dev/shm/cuda.shm.<n>.<pid hex>.<k>`` files of process ``pid``.

    A process that exports GPU memory over CUDA IPC gets such a file from the driver, which the driver may leave
    behind after the process exits (``docs/BENCHMARK_NOTES.md``, "Correctness found on the GPU machine"). Unlinking
    it at exit only removes the name (mappings stay valid), so nothing that still runs is affected.
    """
    pattern = re.compile(rf"^cuda\.shm\.\d+\.{pid:x}\.\d+$")
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if pattern.match(name):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _worker_main(conn, device: Optional[str], parent_pid: int, env: Mapping[str, str], lookahead: bool) -> None:
    """Entry point of the worker process (``env`` was already in its environment at exec; kept for clarity)."""
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="lzc-parent-watch", daemon=True).start()
    conn.send(_STARTED)  # the interpreter is up (torch imported): from here on, silence is the producer's
    dev = torch.device(device) if device is not None else None
    # report_cache: the trainer cannot read this process's feature-cache counters; the producer sends them
    producer = Producer(_PipeChannel(conn), dev, lookahead=lookahead, report_cache=True)
    code = 0
    try:
        producer.run()
    except BaseException:  # noqa: BLE001  (reported here: os._exit below skips the interpreter's report)
        traceback.print_exc()
        code = 1
    finally:
        _release_slots(producer)
        del producer
        gc.collect()  # what only reference cycles held (the producer, tracebacks, frames) is freed now too
        if os.environ.get(DEBUG_IPC_ENV, "") not in ("", "0"):
            _report_cuda_tensors_left()
        conn.close()
    # Exit now, without the interpreter's teardown: with torch loaded it takes a second or more of CPU, during
    # which the parent watchdog (a daemon thread) can no longer run, and on a loaded machine that kept an orphaned
    # worker alive for 5-15 s after its trainer was killed. Nothing else of the worker needs finalizing: the
    # slots (the trainer's) were released above and the pipe is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _release_slots(producer: Producer) -> None:
    """Drop this process's references to the trainer's slots, so that CUDA IPC counts them released.

    The trainer allocated the slots and sent them over CUDA IPC, so in torch's terms the *trainer* is the producer
    of those tensors and this worker a consumer. torch keeps a shared reference counter per sent block; a
    consumer decrements it only when its received storage is freed. The worker ends with ``os._exit`` (no
    interpreter teardown, see :func:`_worker_main`), so without this no received slot is ever freed: the counters stay above
    zero, the trainer's freed slots wait in torch's "limbo" (their GPU memory held) until the trainer exits, and
    at that exit torch prints "Producer process has been terminated before all shared CUDA tensors released".
    Freeing them here (each receiver's deleter synchronizes its stream, then decrements the counter) does it
    before the trainer's :meth:`PipelineClient.close`, which joins this process first, frees its slots.
    """
    try:
        producer.release_slots()
    except Exception:  # noqa: BLE001 - best effort at exit: a failure here only brings back torch's warning
        traceback.print_exc()


#: Set to 1 and a worker lists on stderr, just before it exits, the CUDA tensors it still holds (after it released
#: the slots): what would keep a block the trainer sent over CUDA IPC referenced, and so bring back torch's
#: "Producer process has been terminated before all shared CUDA tensors released" at the trainer's exit.
DEBUG_IPC_ENV = "LZC_DEBUG_IPC"


def _report_cuda_tensors_left(limit: int = 50) -> None:
    """Print the CUDA tensors still alive in this process, with their shapes and the types of what holds them."""
    try:
        left = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
        print(f"[lightning-zerocopy worker {os.getpid()}] {len(left)} CUDA tensor(s) alive at exit", file=sys.stderr)
        for tensor in left[:limit]:
            holders = sorted({type(r).__name__ for r in gc.get_referrers(tensor) if r is not left})
            print(f"  {tuple(tensor.shape)} {tensor.dtype} {tensor.device} {tensor.untyped_storage().nbytes()} B "
                  f"held by {holders}", file=sys.stderr)  # fmt: skip
        del left
    except Exception:  # noqa: BLE001 - a diagnostic
        traceback.print_exc()


def _describe_exit(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"


class WorkerTransport:
    """Trainer end of a worker process (``spawn``) running the pipeline producer.

    Args:
        device: the CUDA device the slots live on, or ``None`` for host slots.
        env: environment variables the worker process starts with (e.g. the MPS pipe directory and
            ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), set before the worker imports anything, so they are in
            place however early the worker initializes CUDA).
        lookahead: the producer samples the next batch while it gathers the current one (see :class:`.Producer`).
    """

    interprocess = True

    def __init__(
        self,
        device: Optional[torch.device] = None,
        env: Optional[Mapping[str, str]] = None,
        lookahead: bool = True,
    ) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._started = False
        self._spawned_at = time.monotonic()
        dev = str(device) if device is not None and torch.device(device).type == "cuda" else None
        if dev is not None and not _DRIVER_FILES_CLEANUP:  # slots are exported over CUDA IPC from this process
            _DRIVER_FILES_CLEANUP.append(os.getpid())
            atexit.register(_unlink_driver_ipc_files, os.getpid())
        self.process = ctx.Process(
            target=_worker_main,
            args=(child, dev, os.getpid(), dict(env or {}), lookahead),
            name="lightning-zerocopy-pipeline-worker",
            daemon=True,  # multiprocessing terminates it at interpreter exit, should everything else fail
        )
        env = dict(env or {})
        with _SPAWN_ENV_LOCK:  # MPS variables must be in place before the worker initializes CUDA: in the
            saved = {k: os.environ.get(k) for k in env}  # environment the child process starts with
            os.environ.update(env)
            try:
                self.process.start()
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        child.close()

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            self.process.join(1.0)  # a killed worker's pipe breaks before waitpid reports its death
            self.check_alive("a command to be sent")
            raise PipelineError(f"the pipeline worker (pid {self.pid}) closed its pipe: {exc}") from exc

    @property
    def starting(self) -> bool:
        """True until the worker's interpreter has started (the client does not count this as producer time)."""
        return not self._started

    def recv(self, timeout: float) -> Optional[tuple]:
        try:
            if not self._conn.poll(timeout):
                return None
            msg = self._conn.recv()
            if msg == _STARTED:
                self._started = True
                return None
            return msg
        except (EOFError, ConnectionResetError, OSError):
            self.process.join(1.0)
            if not self.process.is_alive():
                return None  # the caller's check_alive() names what it waited for and how the worker died
            raise PipelineError(f"the pipeline worker (pid {self.pid}) closed its pipe but is still running")

    def check_alive(self, waiting_for: str) -> None:
        if self.process.is_alive():
            if not self._started and time.monotonic() - self._spawned_at > START_TIMEOUT_S:
                raise PipelineError(
                    f"the pipeline worker process (pid {self.pid}) did not start within {START_TIMEOUT_S:.0f} s "
                    f"(the trainer waited for {waiting_for})"
                )
            return
        raise PipelineError(
            f"the pipeline worker process (pid {self.pid}) {_describe_exit(self.process.exitcode)} while the "
            f"trainer waited for {waiting_for}. Its batches are lost; rerun (resume from the last checkpoint), "
            "or remove PipelineCallback from trainer.callbacks (or set mode: in_process) to build batches in "
            "the trainer process. If it was killed for memory, lower the pipeline depth or the batch size."
        )

    def close(self, timeout: float = 5.0) -> None:
        """Wait for the worker to exit after a stop message; terminate, then kill it if it does not."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
        self._conn.close()
