"""A process that stays *exiting* for a while, as a CUDA process does after a SIGKILL while its device files close
(a pipeline worker under MPS took more than a second, 2 x H200, 2026-11-29): its pipes are closed and its main
thread has ended, but waitpid does not report it until the rest of it ends."""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import threading
import time
from typing import Iterable, Optional

#: ``SYS_exit`` (one thread, unlike ``exit_group``) by machine
_SYS_EXIT = {"x86_64": 60, "aarch64": 93}


def slow_exit_unavailable() -> Optional[str]:
    """Why :func:`exit_slowly` cannot run here, or ``None``."""
    if platform.system() != "Linux" or platform.machine() not in _SYS_EXIT:
        return f"needs Linux on {' or '.join(_SYS_EXIT)}"
    return None


def exit_slowly(seconds: float, conns: Iterable = ()) -> None:
    """Run in a forked child: close ``conns``, end the main thread alone (the process is then exiting, its leader a
    zombie), and SIGKILL the whole process ``seconds`` later from another thread."""
    for conn in conns:
        conn.close()

    def kill_later() -> None:
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_later).start()
    ctypes.CDLL(None).syscall(_SYS_EXIT[platform.machine()], 0)  # returns only if the call failed
    os._exit(3)
