"""The in-process pipeline: the same producer in a thread of the trainer, gathering on a side CUDA stream.

No second process, no CUDA IPC and no MPS: the producer thread calls the DataModule's batch builder (whose C++
sampler and gather release the GIL and run their own threads) and writes into slots on a stream of its own;
the trainer's stream waits on the slot's ready event. Everything else (slots, growth, the slot hand-back
after the step, errors) is the protocol of :mod:`.producer` and :mod:`.client`, shared with the worker.

Optionally the producer's kernels run on streams of CUDA green contexts (:mod:`.sm_share`), which confine them
to a share of the SMs while the trainer's kernels keep the whole GPU: the in-process counterpart of MPS.
"""

from __future__ import annotations

import queue
import threading
import traceback
from typing import TYPE_CHECKING, Optional

import torch

from lightning_zerocopy.pipeline.client import PipelineError
from lightning_zerocopy.pipeline.channel import ChannelClosed
from lightning_zerocopy.pipeline.producer import Producer

if TYPE_CHECKING:
    from lightning_zerocopy.pipeline.sm_share import GreenShare

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
        lookahead: the producer samples the next batch while it gathers the current one (see :class:`.Producer`).
        sm_share: the share of the SMs the producer's kernels run on (green contexts), or ``None`` for ordinary
            streams; kept alive by this transport.
    """

    interprocess = False

    def __init__(
        self,
        device: Optional[torch.device] = None,
        lookahead: bool = True,
        sm_share: Optional["GreenShare"] = None,
    ) -> None:
        self._to_producer: "queue.Queue[tuple]" = queue.Queue()
        self._to_trainer: "queue.Queue[tuple]" = queue.Queue()
        dev = torch.device(device) if device is not None and torch.device(device).type == "cuda" else None
        self._failure: Optional[str] = None
        self.sm_share = sm_share
        self.thread = threading.Thread(
            target=self._run, args=(dev, lookahead, sm_share), name="lightning-zerocopy-pipeline-producer", daemon=True
        )
        self.thread.start()

    def _run(self, device: Optional[torch.device], lookahead: bool, sm_share: Optional["GreenShare"]) -> None:
        try:
            Producer(_QueueChannel(self._to_producer, self._to_trainer), device, lookahead, sm_share).run()
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
