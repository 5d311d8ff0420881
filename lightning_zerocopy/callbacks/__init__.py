"""Lightning callbacks: the batch pipeline (:class:`PipelineCallback`), data telemetry (:class:`DataTelemetry`) and
row-count buckets for the model's matrix products (:class:`GemmRowBuckets`).

Importing starts nothing and imports no PyG (which initializes the CUDA driver), so a script can import them before
it starts MPS; constructing them only stores their configuration. The pipeline's worker starts, and the MPS daemon
is joined, when the DataModule's ``setup`` attaches the callback.
"""

from lightning_zerocopy._lazy import lazy_exports
from lightning_zerocopy.callbacks.gemm_rows import GemmRowBuckets
from lightning_zerocopy.callbacks.pipeline import PipelineCallback
from lightning_zerocopy.callbacks.telemetry import DataTelemetry

__all__ = ["DataTelemetry", "GemmRowBuckets", "LayerwisePredictionWriter", "PipelineCallback"]

# imported on first access: it imports PyG (the layer-wise pass builds PyG batches)
__getattr__ = lazy_exports(__name__, {"LayerwisePredictionWriter": "lightning_zerocopy.callbacks.layerwise_predictions"})
