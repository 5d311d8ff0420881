"""Where a stopping process waits: every thread's Python stack, printed if its exception path outlasts a bound.

With ``LIGHTNING_ZEROCOPY_EXIT_TRACE=<seconds>`` in the environment, a process that starts stopping on an exception
(:func:`trace_a_slow_exit`, called first by the pipeline callback's and the strategy's ``on_exception``) prints every
thread's Python stack to stderr if it still runs that many seconds later, once (:mod:`faulthandler`, from a watchdog
thread of its own: it prints even while the main thread is held in native code). The fault tests on GPUs set it, so a
rank still running after their 10 s bound says where it waits (2 x H200, 2026-11-29: rank 0 of the two-GPU ``ctrl_c``
case was still running, its main thread busy, 10 s after the job's SIGINT; call 31 had passed the same case in 3.2 s).
"""

from __future__ import annotations

import faulthandler
import os
import sys

__all__ = ["ENV", "trace_a_slow_exit"]

#: the environment variable: seconds after the start of the exception path
ENV = "LIGHTNING_ZEROCOPY_EXIT_TRACE"

_CHECKED = [False]


def trace_a_slow_exit() -> bool:
    """Arm the stack dump if :data:`ENV` asks for one (the first call of a process decides); whether it was armed
    now. A value that is not a positive number of seconds is named on stderr, once, and ignored: this runs on the way
    out of a failed run."""
    value = os.environ.get(ENV, "").strip()
    if not value or _CHECKED[0]:
        return False
    _CHECKED[0] = True
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        sys.stderr.write(f"{ENV}={value!r} is not a positive number of seconds: no exit trace\n")
        return False
    faulthandler.dump_traceback_later(seconds, repeat=False, file=sys.stderr, exit=False)
    return True
