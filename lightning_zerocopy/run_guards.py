"""What the ``lightning-zerocopy`` command adds to every trainer it builds, so that a run that cannot finish ends in one
line and leaves nothing behind:

* :class:`~lightning_zerocopy.preemption.PreemptionCheckpoint`, first among the callbacks: SIGTERM saves the current
  step and the command exits with status 143;
* the folders the run writes to, checked before any data is built (:mod:`~lightning_zerocopy.outputs`);
* under Lightning's own ``strategy: ddp``, the rank watch ``zerocopy_ddp`` has
  (:mod:`~lightning_zerocopy.strategies.ddp_watch`): a rank that dies is named in one line by the others.
"""

from __future__ import annotations

from typing import Any

__all__ = ["guard_the_run"]


def guard_the_run(trainer: Any, subcommand: str) -> None:
    """Add the guards above to ``trainer`` (built by the command for ``subcommand``)."""
    from lightning_zerocopy.outputs import check_run_outputs
    from lightning_zerocopy.preemption import PreemptionCheckpoint
    from lightning_zerocopy.strategies.ddp_watch import watch_plain_ddp

    trainer.callbacks.insert(0, PreemptionCheckpoint())  # it saves before the others release what the run holds
    check_run_outputs(trainer, subcommand)
    watch_plain_ddp(trainer)
