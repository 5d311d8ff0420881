"""An SM share for the in-process producer: CUDA streams of green contexts.

A CUDA *green context* is a lightweight context over a subset of the device's SMs that shares the primary
context's memory. Kernels launched on a stream created from it run only on those SMs, while the trainer's
kernels (on ordinary streams) keep the whole GPU. This is the in-process counterpart of giving the worker
process an MPS share: no daemon, no second process, but only the producer is confined.

PyTorch exposes green contexts as ``torch.cuda.green_contexts.GreenContext`` (beta; it needs a CUDA 12.8+
driver and the ``cuda.bindings`` package). The API changed between releases: this module uses per-context
streams (``GreenContext.Stream()``, newer releases) or, failing that, the thread-wide ``set_context()`` of
older ones, and reports anything else as unavailable so that the caller can warn and run without a share.
"""

from __future__ import annotations

from typing import Any

import torch


class SMShareUnavailable(RuntimeError):
    """Green contexts cannot be used here (the message says why)."""


class SMShareWarning(UserWarning):
    """A requested green-context SM share is unavailable; the producer runs without one."""


def sm_count_for(percent: int, device_sms: int) -> int:
    """SMs for a ``percent`` share of ``device_sms`` (rounded, at least 1); the driver may round it up further
    to its partition granularity."""
    if not 1 <= percent <= 99:
        raise ValueError(f"an SM share must be in [1, 99] percent, got {percent}")
    return max(1, min(device_sms, round(device_sms * percent / 100)))


class GreenShare:
    """About ``percent`` % of a device's SMs (``num_sms`` of ``device_sms``) for the threads that ask for it.

    :meth:`stream` gives the calling thread a CUDA stream whose kernels run only on the share: each call
    creates a green context of ``num_sms`` SMs (the driver's split of the device resource starts from the same
    SMs, so every such context covers one partition and their streams run concurrently). With PyTorch's
    per-stream API (``GreenContext.Stream()``) the stream can be used from any thread; with the older
    thread-wide API (``set_context()``) the green context becomes the calling thread's current context and
    its stream the thread's current stream, so call :meth:`stream` from the thread that will launch on it.
    The share owns its green contexts: keep it alive while its streams are in use.

    Raises:
        SMShareUnavailable: no CUDA device, no ``torch.cuda.green_contexts``, or the driver refuses (the message
            names the cause). Checked at construction by creating the first context.
    """

    def __init__(self, device: torch.device, percent: int) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise SMShareUnavailable("green contexts need a CUDA device")
        try:
            from torch.cuda.green_contexts import GreenContext
        except ImportError as exc:
            raise SMShareUnavailable(f"this PyTorch ({torch.__version__}) has no torch.cuda.green_contexts") from exc
        self._api = GreenContext
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.device_sms = torch.cuda.get_device_properties(self.index).multi_processor_count
        self.num_sms = sm_count_for(percent, self.device_sms)
        self.per_stream_api = hasattr(GreenContext, "Stream")
        if not self.per_stream_api and not hasattr(GreenContext, "set_context"):
            raise SMShareUnavailable(f"this PyTorch's GreenContext ({torch.__version__}) has neither Stream() nor set_context()")
        self._contexts: list[Any] = []
        self._spare = self._create()  # fails here, in the caller, when the driver or bindings refuse

    def _create(self) -> Any:
        try:
            with torch.cuda.device(self.index):
                return self._api.create(num_sms=self.num_sms, device_id=self.index)
        except Exception as exc:  # noqa: BLE001 - any failure of the beta API means: no share here
            raise SMShareUnavailable(f"creating a green context of {self.num_sms} SMs failed: {exc}") from exc

    def stream(self) -> torch.cuda.Stream:
        """A stream on the share for the calling thread (see the class docs for the thread-wide API)."""
        ctx, self._spare = (self._spare, None) if self._spare is not None else (self._create(), None)
        self._contexts.append(ctx)
        if self.per_stream_api:
            return ctx.Stream()
        with torch.cuda.device(self.index):
            ctx.set_context()  # this thread's current context and current stream become the green context's
            return torch.cuda.current_stream(self.index)

    def __repr__(self) -> str:
        api = "per-stream" if self.per_stream_api else "thread-wide"
        return f"GreenShare(device={self.index}, num_sms={self.num_sms}/{self.device_sms}, api={api})"
