"""A private CUDA MPS control daemon per job, started before any CUDA context and stopped after the trainer.

MPS (Multi-Process Service) lets the trainer and the pipeline worker share the GPU concurrently, each limited
to a share of the SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, read when a process creates its CUDA context).
What this module guarantees:

* **Private directories.** Each job's daemon gets a fresh ``/tmp/lzc-mps-*`` root with its own
  ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``; an old daemon is never reused (one with a
  pending ``quit`` makes every new CUDA process fail with error 805).
* **One daemon per machine and job.** The process that starts it exports ``LZC_MPS_ROOT``; processes it starts
  later (Lightning's DDP launcher re-runs the script per rank, the pipeline worker) inherit it and *join*
  after checking the daemon is alive and not stopping. Launchers that start all ranks at once (torchrun) are
  coordinated through a lock file keyed by the job (``TORCHELASTIC_RUN_ID`` or ``job_key``): the first rank
  starts it, the others join.
* **Stopped after the trainer is gone.** ``quit`` sent from a process that is itself an MPS client hangs
  until that client exits, and on Ctrl-C Lightning exits without ``teardown``. So a small supervisor process
  in its own session (``setsid``) waits for the starting process to die, then sends ``quit``, waits for the
  daemon, kills it if it does not stop, and removes the directories.
* **Unavailable means a warning, not a failure**: binary missing, ``-d`` refused, another MPS daemon already
  running on the machine (it would own the GPU), a stale daemon to join: warn once, run without MPS.

This file imports only the standard library: the supervisor runs it as a script (``python mps.py
--supervise ...``) without importing torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

if __package__:
    from lightning_zerocopy.process_state import process_alive as _alive
else:  # the supervisor runs this file alone (``python -I``, no package on the path): load the helper by its path
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_lzc_process_state", Path(__file__).parents[1] / "process_state.py")
    _process_state = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_process_state)
    _alive = _process_state.process_alive

CONTROL_BINARY = "nvidia-cuda-mps-control"
#: Exported by the process that started the daemon; inherited by ranks and workers that should join it.
ROOT_ENV = "LZC_MPS_ROOT"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
PERCENT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_PID_FILE = "nvidia-cuda-mps-control.pid"


class MPSUnavailableWarning(UserWarning):
    """MPS could not be used; training runs without it."""


_warned: set[str] = set()


def _warn_once(reason: str, message: str) -> None:
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(
        f"CUDA MPS is unavailable, running without it: {message} (set PipelineCallback(mps=False) to silence this)",
        MPSUnavailableWarning,
        stacklevel=3,
    )


def found_unavailable() -> bool:
    """Whether this process already found MPS unavailable and warned why (e.g. the command's attempt)."""
    return bool(_warned)


# ---- processes ---------------------------------------------------------------------------------------------------
def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_mps_process(pid: int) -> bool:
    return _comm(pid).startswith("nvidia-cuda-mps") and _alive(pid)  # comm is cut at 15 characters


def _environ_has(pid: int, key: str, value: str) -> bool:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{key}={value}".encode() in raw.split(b"\0")


def mps_processes() -> list[int]:
    """Pids of every MPS control daemon and server on this machine (visible in ``/proc``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_mps_process(int(entry)):
            pids.append(int(entry))
    return sorted(pids)


# ---- the daemon handle -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MPSDaemon:
    """This job's MPS control daemon.

    Attributes:
        root: the job's private directory (``pipe/`` and ``log/`` inside, plus ``state.json``).
        daemon_pid: pid of ``nvidia-cuda-mps-control``.
        supervisor_pid: pid of the supervisor that stops it (``None`` in a process that joined).
        owner: True in the process that started it.
    """

    root: str
    daemon_pid: int
    supervisor_pid: Optional[int]
    owner: bool

    @property
    def pipe_dir(self) -> str:
        return os.path.join(self.root, "pipe")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.root, "log")

    def client_env(self, percent: Optional[int] = None) -> dict[str, str]:
        """Environment of a process that should be a client of this daemon, limited to ``percent`` % of SMs."""
        env = {ROOT_ENV: self.root, PIPE_ENV: self.pipe_dir, LOG_ENV: self.log_dir}
        if percent is not None:
            env[PERCENT_ENV] = str(int(percent))
        return env

    def healthy(self) -> bool:
        """The daemon runs and is not being stopped."""
        state = _read_state(self.root)
        return state is not None and not state.get("stopping", False) and _is_mps_process(self.daemon_pid)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the supervisor to stop the daemon now and wait for it (owner only).

        Only call this from a process that is not an MPS client (no CUDA context), or ``quit`` waits for this
        process to exit; normally the supervisor stops the daemon after the trainer process is gone.
        """
        if not self.owner or self.supervisor_pid is None:
            return
        if _alive(self.supervisor_pid):
            os.kill(self.supervisor_pid, _STOP_NOW)
            _wait_for(lambda: not _alive(self.supervisor_pid), timeout)
        state = _read_state(self.root)
        if state is not None and _alive(self.daemon_pid):  # the supervisor is gone without stopping it
            _stop_daemon(self.root, state.get("binary", CONTROL_BINARY), self.daemon_pid, grace=timeout)
        for key in (ROOT_ENV, PIPE_ENV, LOG_ENV):
            if os.environ.get(key, "").startswith(self.root):
                del os.environ[key]


def _wait_for(condition, timeout: float, period: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(period)
    return True


def _read_state(root: str) -> Optional[dict]:
    try:
        return json.loads(Path(root, "state.json").read_text())
    except (OSError, ValueError):
        return None


def _write_state(root: str, state: dict) -> None:
    tmp = Path(root, "state.json.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, Path(root, "state.json"))


def _join(root: str) -> Optional[MPSDaemon]:
    """The running daemon of ``root``, named in this process's environment from now on (``None``: warned why)."""
    state = _read_state(root)
    if state is None:
        _warn_once("stale", f"{ROOT_ENV}={root} names no running MPS daemon of this job (no state file)")
        return None
    daemon = MPSDaemon(root, int(state["daemon_pid"]), None, owner=False)
    if not daemon.healthy():
        why = "is stopping" if state.get("stopping") else f"(pid {daemon.daemon_pid}) is not running"
        _warn_once("stale", f"the MPS daemon of this job in {root} {why}; it is not reused")
        return None
    os.environ.update(daemon.client_env())
    return daemon


def _clear_client_env() -> None:
    for key in (ROOT_ENV, PIPE_ENV, LOG_ENV, PERCENT_ENV):
        os.environ.pop(key, None)


def start_mps(job_key: Optional[str] = None, timeout: float = 10.0) -> Optional[MPSDaemon]:
    """Start this job's MPS daemon, or join the one an ancestor or sibling rank started.

    On success the process environment names the daemon (``CUDA_MPS_PIPE_DIRECTORY``...), so this process's
    CUDA context, created later, is an MPS client; set ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` before that too.
    Call it before anything initializes CUDA.

    Args:
        job_key: identifies the job across ranks started independently (default: ``TORCHELASTIC_RUN_ID``);
            not needed when ranks are children of the starting process (Lightning's launcher).
        timeout: seconds to wait for the daemon to come up.

    Returns:
        The daemon, or ``None`` after a one-time :class:`MPSUnavailableWarning` when MPS cannot be used.
    """
    inherited = os.environ.get(ROOT_ENV)
    if inherited:
        daemon = _join(inherited)
        if daemon is None:
            _clear_client_env()
        return daemon
    key = job_key or os.environ.get("TORCHELASTIC_RUN_ID")
    if key:
        lock_path = Path(tempfile.gettempdir(), f"lzc-mps-{os.getuid()}-{_safe(key)}.lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lock.seek(0)
            root = lock.read().strip()
            if root and _read_state(root) is not None:
                return _join(root)
            daemon = _start(timeout)
            lock.seek(0)
            lock.truncate()
            lock.write(daemon.root if daemon is not None else "")
            return daemon
    return _start(timeout)


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:64]


def _start(timeout: float) -> Optional[MPSDaemon]:
    binary = shutil.which(CONTROL_BINARY)
    if binary is None:
        _warn_once("missing", f"{CONTROL_BINARY} is not on PATH (it ships with the CUDA toolkit/driver)")
        return None
    others = mps_processes()
    if others:
        _warn_once(
            "foreign",
            f"another MPS daemon or server is already running on this machine (pids {others}) and would own the "
            f"GPU; stop it (`echo quit | CUDA_MPS_PIPE_DIRECTORY=<its pipe dir> {CONTROL_BINARY}`) to use a private one",
        )
        return None
    root = tempfile.mkdtemp(prefix="lzc-mps-")
    pipe, log = os.path.join(root, "pipe"), os.path.join(root, "log")
    os.makedirs(pipe)
    os.makedirs(log)
    try:
        proc = subprocess.run([binary, "-d"], env=_control_env(root), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(root, ignore_errors=True)
        _warn_once("refused", f"`{binary} -d` failed: {exc}")
        return None
    if proc.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        detail = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
        _warn_once("refused", f"`{binary} -d` failed: {detail} (MPS may need root or an exclusive GPU)")
        return None
    daemon_pid = _find_daemon(pipe, timeout)
    if daemon_pid is None or not _wait_until_serving(binary, root, timeout):
        _kill_mps_of(pipe)
        shutil.rmtree(root, ignore_errors=True)
        _warn_once("refused", f"`{binary} -d` returned but no daemon answered on its control pipe within {timeout:.0f} s")
        return None
    _write_state(root, {"daemon_pid": daemon_pid, "owner_pid": os.getpid(), "stopping": False})
    with open(os.path.join(log, "supervisor.log"), "ab") as supervisor_log:
        supervisor = subprocess.Popen(  # -I: stdlib only, no script dir on sys.path; own session: outlives Ctrl-C
            [sys.executable, "-I", os.path.abspath(__file__), "--supervise", str(os.getpid()), root, binary, str(daemon_pid)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=supervisor_log,
            close_fds=True,
        )
    daemon = MPSDaemon(root, daemon_pid, supervisor.pid, owner=True)
    _write_state(root, {**(_read_state(root) or {}), "supervisor_pid": supervisor.pid, "binary": binary})
    _wait_for(lambda: Path(root, "supervisor.ready").exists() or supervisor.poll() is not None, timeout)
    if supervisor.poll() is not None:  # no one would stop the daemon: do not use it
        _stop_daemon(root, binary, daemon_pid, grace=5.0)
        _warn_once("refused", f"the MPS supervisor exited at start (code {supervisor.returncode}); see {log}")
        return None
    os.environ.update(daemon.client_env())
    return daemon


def _find_daemon(pipe: str, timeout: float) -> Optional[int]:
    """The pid of the daemon serving ``pipe``: its pid file, else a process with that pipe dir in its environment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid = int(Path(pipe, _PID_FILE).read_text().strip())
            if _is_mps_process(pid):
                return pid
        except (OSError, ValueError):
            pass
        for pid in mps_processes():
            if _environ_has(pid, PIPE_ENV, pipe):
                return pid
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _control_env(root: str) -> dict[str, str]:
    """The environment of the daemon of ``root`` (``-d``) and of a control command sent to it (``quit``,
    ``get_server_list``)."""
    env = dict(os.environ, **{PIPE_ENV: os.path.join(root, "pipe"), LOG_ENV: os.path.join(root, "log")})
    env.pop(PERCENT_ENV, None)
    return env


def _wait_until_serving(binary: str, root: str, timeout: float) -> bool:
    """Wait until the daemon of ``root`` answers a control command (``get_server_list``) on its pipe.

    A process that initializes CUDA while it finds no daemon runs outside MPS without any error, and ``-d``
    returning or the pid file appearing does not prove the daemon listens yet; an answer does.
    """
    env = _control_env(root)
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = subprocess.run(
                [binary], input="get_server_list\n", env=env, capture_output=True, text=True,
                timeout=max(0.5, deadline - time.monotonic()),
            )  # fmt: skip
            if answer.returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _kill_mps_of(pipe: str) -> None:
    for pid in mps_processes():
        if _environ_has(pid, PIPE_ENV, pipe):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- the supervisor ----------------------------------------------------------------------------------------------
#: What the owner sends the supervisor to stop the daemon now (:meth:`MPSDaemon.stop`). Not SIGTERM: a scheduler that
#: pre-empts a job sends that to every process of it, and the trainer, still a client, saves its checkpoint first.
_STOP_NOW = signal.SIGUSR1
#: Seconds the daemon gets to quit once its owner is gone or dying, before it is killed: its clients are dead or
#: dying, and a client still writing its core dump would hold ``quit`` for the owner's full grace.
OWNER_GONE_GRACE_S = 3.0


def _supervise(owner_pid: int, root: str, binary: str, daemon_pid: int, grace: float = 30.0) -> None:
    """Wait until ``owner_pid`` is gone (or :data:`_STOP_NOW`), then stop the daemon and remove ``root``. SIGINT,
    SIGHUP and SIGTERM are ignored: they reach the whole job, and the daemon must outlive its clients."""
    stop_now = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(_STOP_NOW, lambda *_: stop_now.append(True))
    Path(root, "supervisor.ready").touch()
    while not stop_now and _alive(owner_pid):
        time.sleep(0.1)
    # an owner gone or dying (a core dump) is a client that never disconnects: do not wait the full grace for it
    _stop_daemon(root, binary, daemon_pid, grace if stop_now else min(grace, OWNER_GONE_GRACE_S))


def _stop_daemon(root: str, binary: str, daemon_pid: int, grace: float = 30.0) -> None:
    """Mark the daemon stopping, send ``quit``, kill it if it outlives ``grace``, remove ``root``."""
    state = _read_state(root) or {}
    state["stopping"] = True
    _write_state(root, state)
    pipe = os.path.join(root, "pipe")
    env = _control_env(root)
    try:
        # quit waits for the daemon's clients; a client left by a crash holds it, hence the kill below
        subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=grace)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"quit failed: {exc}", file=sys.stderr)
    deadline = time.monotonic() + grace
    while _alive(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(daemon_pid):
        print(f"daemon {daemon_pid} ignored quit; killing it", file=sys.stderr)
        try:
            os.kill(daemon_pid, signal.SIGKILL)
        except OSError:
            pass
    _kill_mps_of(pipe)  # a server the daemon left behind
    shutil.rmtree(root, ignore_errors=True)


#: The driver probe (:mod:`.cuda_probe`), reachable from here too; imported on first access, so running this file
#: as the supervisor needs only the standard library. (Starting MPS for a job is :mod:`.mps_launcher`, which
#: imports this module; this one does not import it back.)
_ELSEWHERE = {
    "cuda_driver_initialized": "lightning_zerocopy.pipeline.cuda_probe",
}


def __getattr__(name: str):
    if name in _ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--supervise":  # run by path: standard library only
        _supervise(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(
            "this module only runs the daemon's supervisor; to run a command under MPS use "
            "`python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent X -- COMMAND`"
        )
