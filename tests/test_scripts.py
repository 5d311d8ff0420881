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
