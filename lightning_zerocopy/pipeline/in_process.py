"""The in-process pipeline: the same producer in a thread of the trainer, gathering on a side CUDA stream.

No second process, no CUDA IPC and no MPS: the producer thread calls the DataModule's batch builder (whose C++
sampler and gather release the GIL and run their own threads) and writes into slots on a stream of its own;
the trainer's stream waits on the slot's ready event. Everything else (slots, growth, the slot hand-back
after the step, errors) is the protocol of :mod:`.producer` and :mod:`.client`, shared with the worker.
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import Optional

import torch

from lightning_zerocopy.pipeline.client import PipelineError
from lightning_zerocopy.pipeline.producer import ChannelClosed, Producer

_CLOSED = ("__closed__",)


class _QueueChannel:
    """Producer end: two queues."""

    def __init__(self, inbox: "queue.Queue[tuple]", outbox: "queue.Queue[tuple]") -> None:
        self.inbox, self.outbox = inbox, outbox

    def send(self, msg: tuple) -> None:
        self.outbox.put(msg)

    def recv(self) -> tuple:
        msg = self.inbox.get()
        if msg is _CLOSED:
            raise ChannelClosed()
        return msg

    def poll(self) -> bool:
        return not self.inbox.empty()


class ThreadTransport:
    """Trainer end of a producer thread.

    Args:
        device: the CUDA device the slots live on (the producer writes on its own stream), or ``None``.
    """

    interprocess = False

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self._to_producer: "queue.Queue[tuple]" = queue.Queue()
        self._to_trainer: "queue.Queue[tuple]" = queue.Queue()
        dev = torch.device(device) if device is not None and torch.device(device).type == "cuda" else None
        self._failure: Optional[str] = None
        self.thread = threading.Thread(
            target=self._run, args=(dev,), name="lightning-zerocopy-pipeline-producer", daemon=True
        )
        self.thread.start()

    def _run(self, device: Optional[torch.device]) -> None:
        try:
            Producer(_QueueChannel(self._to_producer, self._to_trainer), device).run()
        except BaseException:  # noqa: BLE001 - reported to the trainer by check_alive
            self._failure = traceback.format_exc()

    def send(self, msg: tuple) -> None:
        self._to_producer.put(msg)

    def recv(self, timeout: float) -> Optional[tuple]:
        try:
            return self._to_trainer.get(timeout=timeout)
        except queue.Empty:
            return None

    def check_alive(self, waiting_for: str) -> None:
        if self.thread.is_alive():
            return
        detail = f":\n{self._failure}" if self._failure else "."
        raise PipelineError(f"the pipeline producer thread stopped while the trainer waited for {waiting_for}{detail}")

    def close(self, timeout: float = 5.0) -> None:
        self._to_producer.put(_CLOSED)
        self.thread.join(timeout)
