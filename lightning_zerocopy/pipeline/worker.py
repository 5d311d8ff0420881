"""The pipeline's worker process: samples and gathers batches into slots the trainer shares with it.

The worker is a ``spawn``-ed child (CUDA cannot be forked) that runs :class:`~.producer.Producer` over a
duplex pipe. Slot tensors cross the pipe once (GPU slots as bare CUDA IPC memory handles, host slots as
shared-memory file descriptors); afterwards only slot numbers and sizes do.

Lifecycle and faults:

* the worker ignores SIGINT and SIGTERM (a Ctrl-C in the terminal, or a scheduler's SIGTERM, reaches the whole
  process group; the trainer decides how to stop, and a pre-empted trainer still takes its batches until the step
  it saves has ended) and exits when told, when the pipe closes, or within half a second of its parent's death
  (a watchdog thread polls the parent pid), so it never outlives the trainer;
* the trainer notices a dead worker within ~0.2 s of waiting and raises :class:`~.client.PipelineError`
  naming the signal or exit code;
* :meth:`WorkerTransport.close` asks, then closes the pipe (the worker exits at end-of-file), then kills, and joins;
  a trainer that exits without closing its workers (an exception in a plain script) closes them at exit, before
  multiprocessing's own exit handler, whose ``terminate`` the worker ignores and whose ``join`` would then wait.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing.util  # noqa: F401  (its exit handler registered before _close_workers_at_exit: runs after it)
import os
import re
import signal
import sys
import threading
import time
import traceback
import weakref
from typing import Mapping, Optional

import torch
import torch.multiprocessing as mp

from lightning_zerocopy.graph.cuda_ipc import CudaTensorHandle, export_cuda_tensor
from lightning_zerocopy.pipeline.client import PipelineError
from lightning_zerocopy.process_state import exit_signal, process_alive, process_dying, process_ended
from lightning_zerocopy.pipeline.channel import ChannelClosed
from lightning_zerocopy.pipeline.host_waits import sleep_while_waiting, spin_waits
from lightning_zerocopy.pipeline.worker_profile import profile_spec
from lightning_zerocopy.pipeline.producer import Producer


class _PipeChannel:
    """Producer end of the pipe."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def send(self, msg: tuple) -> None:
        self.conn.send(msg)

    def recv(self) -> tuple:
        try:
            return open_slots(self.conn.recv())
        except (EOFError, OSError) as exc:
            raise ChannelClosed() from exc

    def poll(self) -> bool:
        try:
            return self.conn.poll()
        except (EOFError, OSError) as exc:
            raise ChannelClosed() from exc


def _watch_parent(parent_pid: int, period: float = 0.5) -> None:
    """End this worker once its parent is gone (re-parented) or dying: a parent that writes a core dump after a
    SIGABRT still exists, for minutes with a CUDA context, but will never ask for another batch."""
    while True:
        time.sleep(period)
        if os.getppid() != parent_pid or not process_alive(parent_pid):
            os._exit(0)


_SPAWN_ENV_LOCK = threading.Lock()
_STARTED = ("started",)
#: How long a spawned worker may take to start its interpreter (import torch) before the trainer gives up. This
#: is not counted against the client's per-batch timeout: on a loaded machine it alone took more than 30 s.
START_TIMEOUT_S = 600.0


def export_slots(msg: tuple) -> tuple:
    """A ``("slots", ...)`` command with its CUDA buffers as bare IPC memory handles (trainer side).

    Sent through ``torch.multiprocessing`` a CUDA tensor would carry an interprocess event and a reference-counter
    file, which the driver and torch leave in ``/dev/shm`` when a process is killed; a memory handle leaves nothing
    (:mod:`lightning_zerocopy.graph.cuda_ipc`). The trainer owns the slots and frees them only after joining the
    worker, or after the worker was sent replacements (``grow``), which it no longer writes. CPU slots (shared
    host memory, passed as file descriptors) are left as they are.
    """
    return _map_slots(msg, lambda v: export_cuda_tensor(v) if isinstance(v, torch.Tensor) and v.is_cuda else v)


def open_slots(msg: tuple) -> tuple:
    """The inverse of :func:`export_slots` in the worker: each handle opened as a tensor on the slot's GPU."""
    return _map_slots(msg, lambda v: v.open() if isinstance(v, CudaTensorHandle) else v)


def _map_slots(msg: tuple, fn):
    """A ``("slots", stage, index, buffers)`` command with ``fn`` applied to every buffer; any other as it is."""
    if msg[0] != "slots":
        return msg
    kind, stage, index, buffers = msg
    return (kind, stage, index, _map_slot_buffers(buffers, fn))


def _map_slot_buffers(buffers, fn):
    if isinstance(buffers, dict):
        return {name: fn(value) for name, value in buffers.items()}
    return [_map_slot_buffers(b, fn) for b in buffers]


def _worker_main(conn, device: Optional[str], parent_pid: int, env: Mapping[str, str], lookahead: bool) -> None:
    """Entry point of the worker process (``env`` was already in its environment at exec; kept for clarity)."""
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="lzc-parent-watch", daemon=True).start()
    conn.send(_STARTED)  # the interpreter is up (torch imported): from here on, silence is the producer's
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        why = sleep_while_waiting(dev)  # the sampler's read-backs and the gather's waits sleep, not spin a core
        if why is not None and not spin_waits():
            print(f"lightning-zerocopy worker: host waits for the GPU will spin: {why}", file=sys.stderr, flush=True)
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
        conn.close()
    # Exit now, without the interpreter's teardown: with torch loaded it takes a second or more of CPU, during
    # which the parent watchdog (a daemon thread) can no longer run, and on a loaded machine that keeps an orphaned
    # worker alive for 5-15 s after its trainer was killed. Nothing else of the worker needs finalizing: the
    # slots (the trainer's) were released above and the pipe is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _release_slots(producer: Producer) -> None:
    """Drop this process's mappings of the trainer's slots before it exits.

    The worker ends with ``os._exit`` (no interpreter teardown, see :func:`_worker_main`); releasing the slots first
    waits for the producer's queued writes into them, so none is in flight while the trainer, which joins this
    process before it frees its slots, reuses that memory.
    """
    try:
        producer.release_slots()
    except Exception as exc:  # noqa: BLE001 - best effort at exit (a broken CUDA context fails every call)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"[lightning-zerocopy worker {os.getpid()}] releasing the slots at exit failed: {first}", file=sys.stderr)


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


#: seconds a worker whose pipe closed is waited for while it exits (see :meth:`WorkerTransport._await_exit`)
EXITING_WAIT_S = 5.0

#: pids of the worker processes this process started and has not closed (see :func:`kill_workers`)
_LIVE_WORKERS: set[int] = set()


def kill_workers(wait_s: float = 0.0) -> bool:
    """SIGKILL every pipeline worker this process started and has not closed yet: for a process about to end at
    once (``os._exit``) because its GPU state is lost, whose workers would otherwise report the same loss first, and
    for one whose workers must stop reading a stopping peer's GPU memory now. Then wait up to ``wait_s`` seconds
    until each has ended (:func:`~lightning_zerocopy.process_state.process_ended`: its CUDA context gone with it).
    Returns whether every one has."""
    pids = list(_LIVE_WORKERS)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        _LIVE_WORKERS.discard(pid)
    deadline = time.monotonic() + wait_s
    while not (ended := all(process_ended(pid) for pid in pids)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ended


_OPEN_TRANSPORTS: "weakref.WeakSet[WorkerTransport]" = weakref.WeakSet()


@atexit.register  # registered after multiprocessing's exit handler (multiprocessing.util above): runs before it
def _close_workers_at_exit() -> None:
    """Close the workers a trainer leaves open at exit: multiprocessing's exit handler would ``terminate`` them,
    which they ignore, and then wait for them."""
    for transport in list(_OPEN_TRANSPORTS):
        if transport.process.is_alive():
            transport.close(timeout=0.5)


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
        profile_spec()  # a bad LIGHTNING_ZEROCOPY_WORKER_PROFILE fails here, in the trainer, by name
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._started = False
        self._spawned_at = time.monotonic()
        dev = str(device) if device is not None and torch.device(device).type == "cuda" else None
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
                _LIVE_WORKERS.add(self.process.pid)
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        child.close()
        _OPEN_TRANSPORTS.add(self)

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def send(self, msg: tuple) -> None:
        try:
            self._conn.send(export_slots(msg))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            self._await_exit()
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
            self._await_exit()
            if self._exit_code() is not None:
                return None  # the caller's check_alive() names what it waited for and how the worker died
            if process_dying(self.pid):
                raise PipelineError(
                    f"the pipeline worker (pid {self.pid}) closed its pipe and is exiting, but has not ended within "
                    f"{EXITING_WAIT_S:.0f} s"
                ) from None
            raise PipelineError(f"the pipeline worker (pid {self.pid}) closed its pipe but is still running") from None

    def _await_exit(self) -> None:
        """Wait until how a worker whose pipe closed ends is known (:meth:`_exit_code`): its pipe closes as it starts
        exiting, before waitpid reports its death, and a worker under MPS took more than a second to end after a
        SIGKILL (2 x H200, 2026-11-29: ``kill_worker1``): closing its CUDA context. A signal is read as soon as the
        exit begins; an exit code once it has ended, waited for up to :data:`EXITING_WAIT_S` while it exits, 1 s
        if it does not."""
        start = time.monotonic()
        while self._exit_code() is None:
            waited = time.monotonic() - start
            if waited >= EXITING_WAIT_S or (waited >= 1.0 and not process_dying(self.pid)):
                return
            self.process.join(0.02)

    def _exit_code(self) -> Optional[int]:
        """How the worker ended, as ``multiprocessing`` gives it (``-N``: killed by signal N), also while a signal's
        exit is still running (:func:`~lightning_zerocopy.process_state.exit_signal`); ``None`` while it runs."""
        if not self.process.is_alive():
            return self.process.exitcode
        signal_number = exit_signal(self.pid)
        return None if signal_number is None else -signal_number

    def check_alive(self, waiting_for: str) -> None:
        exitcode = self._exit_code()
        if exitcode is None:
            if not self._started and time.monotonic() - self._spawned_at > START_TIMEOUT_S:
                raise PipelineError(
                    f"the pipeline worker process (pid {self.pid}) did not start within {START_TIMEOUT_S:.0f} s "
                    f"(the trainer waited for {waiting_for})"
                )
            return
        raise PipelineError(
            f"the pipeline worker process (pid {self.pid}) {_describe_exit(exitcode)} while the "
            f"trainer waited for {waiting_for}. Its batches are lost; rerun (resume from the last checkpoint), "
            "or remove PipelineCallback from trainer.callbacks (or set mode: in_process) to build batches in "
            "the trainer process. If it was killed for memory, lower the pipeline depth or the batch size."
        )

    def close(self, timeout: float = 5.0) -> None:
        """Wait ``timeout`` seconds for the worker to exit after a stop message; close the pipe (it exits at
        end-of-file) and wait as long again, at most 2 s; then kill it (it ignores SIGTERM)."""
        _LIVE_WORKERS.discard(self.process.pid)
        self.process.join(timeout)
        if self.process.is_alive():
            self._conn.close()
            self.process.join(min(2.0, timeout))
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
        self._conn.close()
