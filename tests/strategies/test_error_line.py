"""The claim of the job's one ``error:`` line (``strategies/error_line.py``) between processes: the first to claim
holds it, the file outlives its maker, and a process that cannot claim writes the line rather than none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "lightning_zerocopy" / "strategies" / "error_line.py"
# the module alone (standard library only), loaded by its path: a process starts in well under a second
LOAD = (
    "import importlib.util, sys\n"
    f"spec = importlib.util.spec_from_file_location('error_line', {str(MODULE)!r})\n"
    "error_line = importlib.util.module_from_spec(spec); spec.loader.exec_module(error_line)\n"
)


def _claimant(reference: str) -> subprocess.Popen:
    """A process that joins ``reference`` (``"new"``: a file it makes itself) and prints ``<reference> <joined>``;
    at a line on stdin claims twice and prints both answers; at the next, exits."""
    code = LOAD + (
        "ref = sys.argv[1]\n"
        "ref = error_line.share() if ref == 'new' else ref\n"
        "print(ref, error_line.join(ref), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(error_line.claim(), error_line.claim(), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, reference], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip


def _claim(proc: subprocess.Popen) -> list[str]:
    proc.stdin.write("\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


def _end(proc: subprocess.Popen) -> None:
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


def test_the_first_claimant_holds_the_line_whoever_made_the_file_and_after_its_maker_is_gone() -> None:
    maker = _claimant("new")
    ref, joined = maker.stdout.readline().split()
    second, third = _claimant(ref), _claimant(ref)
    assert [p.stdout.readline().split() for p in (second, third)] == [[ref, "True"]] * 2 and joined == "True"
    try:
        assert _claim(second) == ["True", "True"]  # decided once: the same answer afterwards
        assert _claim(maker) == ["False", "False"]
        _end(maker)
        assert _claim(third) == ["False", "False"]  # the file outlived the process that made it
    finally:
        for proc in (maker, second, third):
            if proc.poll() is None:
                _end(proc)


def test_a_process_that_cannot_claim_writes_the_line_rather_than_leave_the_job_without_one() -> None:
    maker = _claimant("new")
    ref = maker.stdout.readline().split()[0]
    _claim(maker)
    _end(maker)
    late = _claimant(ref)  # the maker is gone, and its file with it for a process that had not opened it
    assert late.stdout.readline().split() == [ref, "False"]
    assert _claim(late) == ["True", "True"]
    _end(late)
    nobody = subprocess.run([sys.executable, "-c", LOAD + "print(error_line.claim(), error_line.line_prefix())"],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert nobody.stdout.split() == ["True", "error:"], nobody.stderr
