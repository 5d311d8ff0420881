"""Who handles a signal in this process: the native ``sigaction`` handler and the shared object that holds it
(``dladdr``), for fault tests that must know whether a signal sent from outside can end the process at all (a GPU
image's libraries may install their own handlers for SIGABRT or SIGSEGV)."""

from __future__ import annotations

import ctypes
import signal

__all__ = ["native_handler"]


class _SigAction(ctypes.Structure):  # glibc's struct sigaction on Linux x86_64 / aarch64
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]  # fmt: skip


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]  # fmt: skip


def native_handler(signum: int) -> str:
    """``"default"``, ``"ignored"`` or ``"<symbol> in <library>"`` for the handler of ``signum`` in this process;
    ``"Python"`` is added when a Python-level handler (``signal.signal``) is set too."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = _SigAction()
    if libc.sigaction(int(signum), None, ctypes.byref(old)) != 0:
        return f"unknown (sigaction failed: errno {ctypes.get_errno()})"
    python = signal.getsignal(signum) not in (signal.SIG_DFL, signal.SIG_IGN, None)
    if not old.handler:
        text = "default"
    elif old.handler == 1:
        text = "ignored"
    else:
        info = _DlInfo()
        found = libc.dladdr(ctypes.c_void_p(old.handler), ctypes.byref(info))
        where = (info.fname or b"?").decode(errors="replace") if found else "?"
        name = (info.sname or b"?").decode(errors="replace") if found else "?"
        text = f"{name} in {where}"
    return f"{text} (Python handler set)" if python else text
