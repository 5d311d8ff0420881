"""MPS control logic against a fake ``nvidia-cuda-mps-control`` put on PATH by the test.

The fake behaves like the real tool where this module depends on it: ``-d`` forks a daemon (its process name
starts with ``nvidia-cuda-mps``) that writes its pid file into ``CUDA_MPS_PIPE_DIRECTORY``; a plain invocation
reads commands on stdin (``quit`` stops the daemon). ``FAKE_MPS_FAIL=1`` makes ``-d`` fail as without permission.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from helpers import sigint_at_default
from helpers.core_dumps import core_dumps_unavailable, remove_cores, start_heavy_child
from lightning_zerocopy.pipeline import mps

FAKE = textwrap.dedent(
    """\
    #!{python}
    import os, sys, time
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    cmdfile = os.path.join(pipe, "fake-command")
    listening = os.path.join(pipe, "fake-listening")
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("FAKE_MPS_FAIL"):
            print("An MPS daemon cannot be started: permission denied", file=sys.stderr)
            sys.exit(1)
        os.makedirs(pipe, exist_ok=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(os.devnull, os.O_RDWR)
                for i in (0, 1, 2):
                    os.dup2(fd, i)
                with open(pidfile + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(pidfile + ".tmp", pidfile)
                time.sleep(float(os.environ.get("FAKE_MPS_LISTEN_DELAY", "0")))  # pid file first, then the pipe
                open(listening, "w").close()
                while True:
                    if os.path.exists(cmdfile):
                        cmd = open(cmdfile).read().strip()
                        os.remove(cmdfile)
                        if cmd == "quit" and not os.environ.get("FAKE_MPS_IGNORE_QUIT"):
                            os.remove(pidfile)
                            os.remove(listening)
                            os._exit(0)
                    time.sleep(0.02)
            os._exit(0)
        os.wait()
        for _ in range(200):
            if os.path.exists(pidfile):
                break
            time.sleep(0.01)
        sys.exit(0)
    cmd = sys.stdin.read().strip()
    if not os.path.exists(listening):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    with open(cmdfile, "w") as f:
        f.write(cmd)
    for _ in range(250):
        if not os.path.exists(cmdfile):
            break
        time.sleep(0.02)
    """
)


def _alive(pid: int) -> bool:
    return mps._alive(pid)


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """PATH with the fake control binary; MPS env cleared; every fake daemon killed afterwards."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / mps.CONTROL_BINARY
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    for key in (mps.ROOT_ENV, mps.PIPE_ENV, mps.LOG_ENV, mps.PERCENT_ENV, "TORCHELASTIC_RUN_ID"):
        monkeypatch.setenv(key, "")  # recorded, so teardown restores what start_mps() writes into os.environ
        monkeypatch.delenv(key)
    monkeypatch.setattr(mps, "_warned", set())
    # fake daemons of earlier tests are stopped asynchronously (by their supervisors): let them finish, or a
    # start here would rightly see "another MPS daemon" on the machine
    _wait_until_no_mps_processes(timeout=15)
    before = set(Path("/tmp").glob("lzc-mps-*"))
    yield exe
    for root in set(Path("/tmp").glob("lzc-mps-*")) - before:  # whatever a failed test left behind
        state = mps._read_state(str(root)) or {}
        for key in ("supervisor_pid", "daemon_pid"):
            if key in state and mps._alive(state[key]):
                os.kill(state[key], signal.SIGKILL)
        if root.is_dir():
            shutil.rmtree(root, ignore_errors=True)
        else:
            root.unlink(missing_ok=True)
    for pid in mps.mps_processes():
        os.kill(pid, signal.SIGKILL)
    _wait_until_no_mps_processes(timeout=15)  # SIGKILL is delivered asynchronously


def _wait_until_no_mps_processes(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while mps.mps_processes() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_start_exports_private_dirs_and_stop_quits(fake_mps):
    assert mps.mps_processes() == []
    daemon = mps.start_mps()
    assert daemon is not None and daemon.owner and daemon.healthy()
    assert os.environ[mps.PIPE_ENV] == daemon.pipe_dir and daemon.pipe_dir.startswith(daemon.root)
    assert os.environ[mps.ROOT_ENV] == daemon.root and Path(daemon.log_dir).is_dir()
    assert mps.mps_processes() == [daemon.daemon_pid]
    assert daemon.client_env(10)[mps.PERCENT_ENV] == "10"
    daemon.stop(timeout=10)
    assert not _alive(daemon.daemon_pid) and not _alive(daemon.supervisor_pid)
    assert not Path(daemon.root).exists()
    assert mps.PIPE_ENV not in os.environ


def test_start_returns_only_once_the_daemon_answers_on_its_pipe(fake_mps, monkeypatch):
    """The pid file appears before the daemon listens; a CUDA context created in between would silently run
    outside MPS, so start_mps() waits for an answer to a control command."""
    monkeypatch.setenv("FAKE_MPS_LISTEN_DELAY", "1.0")
    daemon = mps.start_mps()
    assert daemon is not None
    assert Path(daemon.pipe_dir, "fake-listening").exists()
    daemon.stop(timeout=10)


def test_a_child_joins_the_daemon_instead_of_starting_one(fake_mps):
    daemon = mps.start_mps()
    try:
        joined = mps.start_mps()  # what a DDP rank re-running the script with the inherited env does
        assert joined is not None and not joined.owner
        assert joined.root == daemon.root and joined.daemon_pid == daemon.daemon_pid
        assert mps.mps_processes() == [daemon.daemon_pid]
    finally:
        daemon.stop(timeout=10)


def test_ranks_started_at_once_share_one_daemon_through_the_lock(fake_mps, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"test-{os.getpid()}-{time.time_ns()}")
    first = mps.start_mps()
    try:
        for key in (mps.ROOT_ENV, mps.PIPE_ENV, mps.LOG_ENV):  # a sibling rank has not inherited it
            monkeypatch.delenv(key)
        second = mps.start_mps()
        assert second is not None and not second.owner and second.root == first.root
    finally:
        first.stop(timeout=10)


def test_stale_daemon_is_never_reused(fake_mps, monkeypatch):
    daemon = mps.start_mps()
    state = mps._read_state(daemon.root)
    state["stopping"] = True  # a daemon with a pending quit (CUDA error 805 for a new client)
    mps._write_state(daemon.root, state)
    try:
        with pytest.warns(mps.MPSUnavailableWarning, match="is stopping"):
            assert mps.start_mps() is None
        assert mps.PIPE_ENV not in os.environ  # this process's CUDA context will not look for it
    finally:
        daemon.stop(timeout=10)


def test_dead_daemon_named_by_env_warns(fake_mps, monkeypatch, tmp_path):
    root = tmp_path / "gone"
    root.mkdir()
    mps._write_state(str(root), {"daemon_pid": 2**22 + 7, "stopping": False})
    monkeypatch.setenv(mps.ROOT_ENV, str(root))
    with pytest.warns(mps.MPSUnavailableWarning, match="is not running"):
        assert mps.start_mps() is None


def test_foreign_daemon_owns_the_gpu(fake_mps, tmp_path):
    foreign_pipe = tmp_path / "foreign"
    env = dict(os.environ, **{mps.PIPE_ENV: str(foreign_pipe)})
    subprocess.run([str(fake_mps), "-d"], env=env, check=True, timeout=10)
    foreign = int((foreign_pipe / "nvidia-cuda-mps-control.pid").read_text())
    with pytest.warns(mps.MPSUnavailableWarning, match=rf"already running.*{foreign}"):
        assert mps.start_mps() is None
    assert mps.mps_processes() == [foreign]  # left alone


def test_unavailable_warns_once(fake_mps, monkeypatch):
    roots_before = set(Path("/tmp").glob("lzc-mps-*"))
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.warns(mps.MPSUnavailableWarning, match="permission denied"):
        assert mps.start_mps() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mps.start_mps() is None  # same reason: no second warning
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.warns(mps.MPSUnavailableWarning, match="not on PATH"):
        assert mps.start_mps() is None
    assert set(Path("/tmp").glob("lzc-mps-*")) == roots_before  # a failed start leaves no directory
    assert mps.PIPE_ENV not in os.environ


_OWNER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from lightning_zerocopy.pipeline import mps
    d = mps.start_mps()
    print(d.root, d.daemon_pid, d.supervisor_pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGABRT, signal.SIGTERM],
                         ids=["SIGKILL", "SIGINT", "SIGABRT", "SIGTERM"])  # fmt: skip
def test_supervisor_stops_the_daemon_after_the_owner_dies(fake_mps, sig):
    root_dir = str(Path(__file__).resolve().parents[2])
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER.format(root=root_dir)], stdout=subprocess.PIPE, text=True, env=dict(os.environ),
        preexec_fn=sigint_at_default,
    )
    try:
        line = owner.stdout.readline().split()
        assert len(line) == 3, "owner did not start the daemon"
        root, daemon_pid, supervisor_pid = line[0], int(line[1]), int(line[2])
        assert _alive(daemon_pid) and _alive(supervisor_pid)
        owner.send_signal(sig)  # SIGINT: Ctrl-C reaches the group; the supervisor has its own session
        owner.wait(timeout=10)
        assert _wait(lambda: not _alive(daemon_pid), 15), "daemon outlived its owner"
        assert _wait(lambda: not _alive(supervisor_pid), 5)
        assert not Path(root).exists()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_daemon_stops_while_an_aborted_owner_still_writes_its_core(fake_mps, tmp_path):
    """A SIGABRT makes the kernel write the owner's memory to a core file before it ends (minutes for a CUDA
    process): the supervisor stops the daemon at once, not when the dump is done (before, it waited)."""
    reason = core_dumps_unavailable()
    if reason:
        pytest.skip(reason)
    root_dir = str(Path(__file__).resolve().parents[2])
    owner = start_heavy_child(tmp_path, gib=1.5, code=_OWNER.format(root=root_dir).replace("\n", "; ").strip("; "))
    try:
        root, daemon_pid, supervisor_pid = owner.stdout.readline().split()
        daemon_pid, supervisor_pid = int(daemon_pid), int(supervisor_pid)
        start = time.monotonic()
        owner.send_signal(signal.SIGABRT)
        # the supervisor's first step in stopping the daemon marks the state file: seen while the owner still dumps?
        stopping = lambda: (mps._read_state(root) or {}).get("stopping") is True  # noqa: E731
        assert _wait(lambda: stopping() or not _alive(daemon_pid) or owner.poll() is not None, 60)
        owner_still_dumping = owner.poll() is None
        owner.wait(timeout=120)
        took = time.monotonic() - start
        if not owner_still_dumping and took < 1.0:
            pytest.skip(f"the core dump took only {took:.2f} s: too short to observe")
        assert owner_still_dumping, f"the daemon was left alone until its owner's {took:.1f} s core dump ended"
        assert _wait(lambda: not _alive(daemon_pid), 15), "daemon outlived its owner"
        assert _wait(lambda: not _alive(supervisor_pid), 5) and not Path(root).exists()
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        remove_cores(tmp_path)


def test_a_sigterm_to_the_whole_job_leaves_the_daemon_until_its_owner_exits(fake_mps):
    """A scheduler pre-empting a job sends SIGTERM to every process of it: the supervisor keeps the daemon while the
    owner (a trainer saving its checkpoint, still a client) runs, and stops it once the owner is gone."""
    root_dir = str(Path(__file__).resolve().parents[2])
    owner = subprocess.Popen([sys.executable, "-c", _OWNER.format(root=root_dir)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ))  # fmt: skip
    try:
        root, daemon_pid, supervisor_pid = owner.stdout.readline().split()
        daemon_pid, supervisor_pid = int(daemon_pid), int(supervisor_pid)
        os.kill(supervisor_pid, signal.SIGTERM)
        time.sleep(1.0)
        assert _alive(supervisor_pid) and _alive(daemon_pid), "the supervisor stopped the daemon under a live owner"
        owner.kill()
        owner.wait(timeout=10)
        assert _wait(lambda: not _alive(daemon_pid), 15), "daemon outlived its owner"
        assert _wait(lambda: not _alive(supervisor_pid), 5) and not Path(root).exists()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_daemon_that_ignores_quit_is_killed(fake_mps, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    daemon = mps.start_mps()
    # the supervisor's grace is 30 s by default; run its stop logic here with a short one (not _supervise(),
    # which would install its signal dispositions in the test process)
    os.kill(daemon.supervisor_pid, signal.SIGKILL)
    mps._stop_daemon(daemon.root, str(fake_mps), daemon.daemon_pid, grace=1.0)
    assert _wait(lambda: not _alive(daemon.daemon_pid), 5)
    assert not Path(daemon.root).exists()


@pytest.mark.parametrize("extra, expected", [([], ("90", "10")), (["--trainer-sm-percent", "100"], ("100", "10"))])
def test_launcher_runs_the_command_as_a_client_and_stops_the_daemon_after_it(fake_mps, tmp_path, extra, expected):
    """``python -m ...mps_launcher --worker-sm-percent 10 -- CMD``: CMD starts with the MPS variables (the trainer's
    90 %, or its own ``--trainer-sm-percent``: MPS caps each client, the shares may add up to more than 100)."""
    out = tmp_path / "env.txt"
    show = (
        "import os; e = os.environ; open(%r, 'w').write(' '.join([e['CUDA_MPS_PIPE_DIRECTORY'], "
        "e['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'], e['LZC_MPS_WORKER_PERCENT'], str(os.getpid())]))" % str(out)
    )
    launcher = [sys.executable, "-m", "lightning_zerocopy.pipeline.mps_launcher", "--worker-sm-percent", "10", *extra,
                "--", sys.executable, "-c", show]  # fmt: skip
    proc = subprocess.run(launcher, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pipe, trainer_percent, worker_percent, _ = out.read_text().split()
    assert (trainer_percent, worker_percent) == expected
    root = Path(pipe).parent
    assert _wait(lambda: not root.exists(), 15), "the daemon's directory outlived the command"
    assert mps.mps_processes() == []


@pytest.mark.parametrize("bad", ["0", "101"])
def test_launcher_rejects_a_trainer_share_outside_1_to_100(bad):
    launcher = [sys.executable, "-m", "lightning_zerocopy.pipeline.mps_launcher", "--trainer-sm-percent", bad, "--", "true"]
    proc = subprocess.run(launcher, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--trainer-sm-percent must be in [1, 100]" in proc.stderr, proc.stderr
