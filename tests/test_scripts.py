"""scripts/setup_env.sh: installs once, then skips set-up while the venv is current (issue 10, item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv whose python runs this interpreter on this checkout and logs pip calls instead of running them."""
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> {str(log)!r}; exit 0; fi\n'
        f"PYTHONPATH={str(ROOT)!r} exec {sys.executable!r} \"$@\"\n"
    )
    python.chmod(0o755)
    return venv, log


def _setup(venv: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "LZC_REINSTALL")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), str(venv)], env={**environ, **env},
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _pip_calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_setup_is_skipped_while_the_venv_is_current(tmp_path: Path) -> None:
    venv, log = _fake_venv(tmp_path)
    first = _setup(venv)
    assert first.returncode == 0, first.stderr
    installs = _pip_calls(log)
    assert installs == 3 and "ready" in first.stdout  # pip itself, torch, this package

    again = _setup(venv)
    assert again.returncode == 0, again.stderr
    assert _pip_calls(log) == installs, "a current venv must not be reinstalled"
    assert again.stdout.strip().count("\n") == 0 and "is current" in again.stdout and "skipping" in again.stdout

    for env in ({"TORCH_SPEC": "torch==2.12.0"}, {"LZC_REINSTALL": "1"}):  # another torch, or forced
        before = _pip_calls(log)
        rerun = _setup(venv, **env)
        assert rerun.returncode == 0, rerun.stderr
        assert _pip_calls(log) == before + 3 and "is current" not in rerun.stdout, env


def _in_a_background_job(command: str) -> subprocess.CompletedProcess:
    """``bash -c 'COMMAND & wait $!'``: a non-interactive shell starts a background job with SIGINT ignored, as
    ``bash scripts/test.sh &`` in a script does, and an ignored signal stays ignored in every child."""
    return subprocess.run(["bash", "-c", f"{command} & wait $!"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)  # fmt: skip


def test_a_child_a_test_interrupts_starts_with_sigint_at_its_default_in_a_background_job() -> None:
    probe = (
        "import signal, subprocess, sys; sys.path.insert(0, 'tests'); from helpers import sigint_at_default; "
        "child = 'import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)'; "
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN); "
        "sys.exit(subprocess.call([sys.executable, '-c', child], preexec_fn=sigint_at_default))"
    )
    proc = _in_a_background_job(f"{sys.executable!s} -c \"{probe}\"")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], proc.stdout  # the job ignores SIGINT; the child takes Ctrl-C


def test_a_ctrl_c_test_passes_when_the_suite_runs_as_a_background_job() -> None:
    """One of the tests that interrupt a child with SIGINT, run by pytest in a background job: its result must not
    depend on how the suite was launched."""
    test = "tests/pipeline/test_mps.py::test_supervisor_stops_the_daemon_after_the_owner_dies[SIGINT]"
    proc = _in_a_background_job(f"{sys.executable} -m pytest -q -p no:cacheprovider '{test}'")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
