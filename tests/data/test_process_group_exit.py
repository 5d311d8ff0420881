"""A gloo process group is destroyed before the interpreter's teardown (``data/process_group_exit.py``): left to it, a
finished 2-rank gloo fit now and then ended with ``terminate called without an active exception`` (SIGABRT)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RANK = textwrap.dedent(
    """
    import atexit, sys
    import torch.distributed as dist
    sys.path.insert(0, {root!r})
    atexit.register(lambda: print("AT EXIT: group alive =", dist.is_initialized(), flush=True))  # runs last (LIFO)
    dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
    {call}
    dist.all_reduce(__import__("torch").ones(3))
    """
)


def _exit_state(tmp_path: Path, call: str) -> str:
    code = _RANK.format(root=str(ROOT), store=tmp_path / f"store-{len(call)}", call=call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("AT EXIT")][0]


def test_the_group_is_destroyed_at_exit_while_the_interpreter_is_whole(tmp_path: Path) -> None:
    registered = "from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit; " \
                 "destroy_process_group_at_exit(); destroy_process_group_at_exit()"  # fmt: skip
    assert _exit_state(tmp_path, registered) == "AT EXIT: group alive = False"
    assert _exit_state(tmp_path, "pass") == "AT EXIT: group alive = True"  # what Lightning leaves for gloo


def test_a_failed_run_leaves_the_group_and_a_sigterm_stop_does_not(tmp_path: Path) -> None:
    """A rank that failed (a peer died) may have a collective of the group open; destroying it would wait for it."""
    base = "from lightning_zerocopy.data.process_group_exit import destroy_process_group_at_exit, run_failed; " \
           "destroy_process_group_at_exit(); "  # fmt: skip
    failed = base + "run_failed(RuntimeError('Connection reset by peer'))"
    assert _exit_state(tmp_path, failed) == "AT EXIT: group alive = True"
    stopped = base + "from pytorch_lightning.utilities.exceptions import SIGTERMException; run_failed(SIGTERMException())"
    assert _exit_state(tmp_path, stopped) == "AT EXIT: group alive = False"
