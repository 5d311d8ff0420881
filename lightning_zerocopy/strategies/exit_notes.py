"""What a rank that stops says to the others, and how a rank tells whose account it stops on.

A rank stopping on an exception leaves a one-line *exit note* (:func:`exit_note`) in the process group's store
(:meth:`~lightning_zerocopy.strategies.liveness.RankLiveness.announce`); a rank whose watch finds a peer gone or
stopping raises :class:`PeerRankExited`, and :func:`caused_by_a_peer` tells such an error (or a collective's error
tied to the gone rank) from an error of the rank's own.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["PeerRankExited", "caused_by_a_peer", "exit_note", "is_interrupt", "is_interrupt_note"]

_NOTE_CHARS = 600


class PeerRankExited(RuntimeError):
    """Another rank of the job exited while this one was still running."""


def exit_note(exception: BaseException) -> str:
    """What a rank stopping on ``exception`` tells the others: ``interrupted (SIGINT|SIGTERM)`` for Ctrl-C and
    Lightning's SIGTERM exception, else ``"<Type>: <first line of the message>"`` (shortened)."""
    if isinstance(exception, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if any(c.__name__ == "SIGTERMException" for c in type(exception).__mro__):  # Lightning's (a SystemExit), or
        return "interrupted (SIGTERM)"  # lightning_zerocopy.preemption.PreemptedNow
    text = str(exception).strip().splitlines()
    line = f"{type(exception).__name__}: {text[0]}" if text else type(exception).__name__
    return line if len(line) <= _NOTE_CHARS else line[: _NOTE_CHARS - 3] + "..."


def is_interrupt(exception: BaseException) -> bool:
    """Whether ``exception`` is how Ctrl-C (``KeyboardInterrupt``) or SIGTERM (Lightning's exception) arrive."""
    return is_interrupt_note(exit_note(exception))


def is_interrupt_note(note: Optional[str]) -> bool:
    """Whether an exit note (``None``: none left) says its rank was interrupted, not failed."""
    return note is not None and note.startswith("interrupted")


def caused_by_a_peer(exception: BaseException) -> bool:
    """Whether ``exception`` stopped this rank because another rank of the machine went away: a
    :class:`PeerRankExited`, or an error of a collective that
    :meth:`~lightning_zerocopy.strategies.liveness.RankLiveness.explain` tied to the gone rank."""
    return isinstance(exception, PeerRankExited) or isinstance(getattr(exception, "peer_rank_exit", None), str)
