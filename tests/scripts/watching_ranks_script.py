"""One rank of a CPU job (gloo) that does nothing but watch the other ranks, run through the command's own error
handling (``lightning_zerocopy.cli.main``), for ``tests/strategies/test_one_error_line.py``.

``python watching_ranks_script.py HOW OUT``, with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set (the test starts every rank itself, as ``torchrun`` does). Each rank joins the process group,
watches the others (:func:`~lightning_zerocopy.strategies.liveness_lifecycle.watch_ranks`, 0.1 s), writes
``OUT/ready<rank>`` and then, as ``HOW`` says:

* ``mapped``: reads every other rank's GPU memory (``depend_on``, the clique cache), its main thread busy: a gone
  rank ends the process from the watch at once;
* ``waiting``: its main thread waits outside any collective: the watch raises ``PeerRankExited`` there, which takes
  the path of a rank's exception (the strategy's ``stop_watch``, then the command's error line);
* ``collectives``: runs all-reduces: a gone rank fails them (gloo's ``Connection reset by peer``), or the watch
  interrupts them, whichever comes first;
* ``stuck``: its main thread swallows ``PeerRankExited``, as a thread blocked in native code misses it: the watch ends
  the process after its grace (1 s);
* ``failing``: as ``mapped``, but waiting as ``waiting`` does; once every rank is ready, rank 1 fails on its own
  (its pipeline worker was killed: a ``PipelineError``), and exits after its error line.

``launcher``: rank 0 as Lightning's launcher (``ZeroCopyScriptLauncher``) with ``WORLD_SIZE`` ranks: it hands its
claim file down and starts the other ranks (``HOW`` ``launched``), which only start watching it, as before the
rendezvous (``cli.main``'s launch watch), write ``OUT/ready<rank>`` and wait; it writes ``OUT/ready0`` and waits too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from lightning_zerocopy import cli
from lightning_zerocopy.pipeline.client import PipelineError
from lightning_zerocopy.strategies import error_line
from lightning_zerocopy.strategies.liveness import LAUNCHER_ENV, PeerRankExited
from lightning_zerocopy.strategies.liveness_lifecycle import stop_watch, watch_ranks

HOW, OUT = sys.argv[1], sys.argv[2]


def _run(args: object) -> None:
    """Stands for the trainer's run that ``cli.main`` starts (``build_cli``)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    watch = watch_ranks(None, rank, world, 0.1, stopping=lambda: False)
    if HOW == "stuck":
        watch.grace = 1.0
    if HOW in ("mapped", "failing"):
        watch.depend_on(set(range(world)))
    with open(os.path.join(OUT, f"ready{rank}"), "w") as f:
        f.write(str(os.getpid()))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if HOW == "collectives":
                    dist.all_reduce(torch.ones(4))
                ready = all(os.path.exists(os.path.join(OUT, f"ready{r}")) for r in range(world))
                if HOW == "failing" and rank == 1 and ready:
                    raise PipelineError("the pipeline worker process (pid 4242) was killed by SIGKILL")
                time.sleep(0.02)
            except PeerRankExited:
                if HOW != "stuck":
                    raise
    except BaseException as exc:
        stop_watch(watch, exc)  # as the strategy's on_exception: the exit note, then the gone rank named
        raise
    raise RuntimeError("no rank went away within 120 s")


def _ready_and_wait(args: object) -> None:
    """A launched rank before its rendezvous (``cli.main`` started its watch of the launcher)."""
    with open(os.path.join(OUT, f"ready{os.environ.get('RANK', '0')}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    raise RuntimeError("the launcher did not go away within 120 s")


if HOW == "launcher":
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    error_line.hand_down()
    for rank in range(1, int(os.environ["WORLD_SIZE"])):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank))
        subprocess.Popen([sys.executable, __file__, "launched", OUT], env=env)
    _ready_and_wait(None)
else:
    cli.build_cli = _ready_and_wait if HOW == "launched" else _run
    cli.main([])
