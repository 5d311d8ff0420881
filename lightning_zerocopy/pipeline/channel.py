"""The producer's end of the pipeline's message channel: what a channel is, and the error for a closed one.

A :class:`Channel` is a Pipe end (:mod:`.worker`) or a pair of queues (:mod:`.in_process`); the producer
(:mod:`.producer`) and its feature-cache report (:mod:`.cache_report`) send through it and raise
:class:`ChannelClosed` once the trainer's end is gone.
"""

from __future__ import annotations

from typing import Protocol


class Channel(Protocol):
    """A duplex message channel (a Pipe end or a pair of queues)."""

    def send(self, msg: tuple) -> None: ...

    def recv(self) -> tuple: ...

    def poll(self) -> bool: ...


class ChannelClosed(Exception):
    """The other side of the channel is gone."""
