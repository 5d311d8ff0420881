"""Lightning callbacks: the batch pipeline (:class:`PipelineCallback`) and data telemetry (:class:`DataTelemetry`).

Importing starts nothing; the pipeline's worker and MPS daemon start only when the callback is constructed
with ``mps=True`` (the daemon) or attached by the DataModule (the worker).
"""

from lightning_zerocopy.callbacks.pipeline import PipelineCallback
from lightning_zerocopy.callbacks.telemetry import DataTelemetry

__all__ = ["DataTelemetry", "PipelineCallback"]
