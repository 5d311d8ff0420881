"""How fast is one part: one script per part of the data path (``python -m benchmarks.parts.<name>``: gather,
sampling, the pipeline, ...) and the training step on pre-staged batches (``python -m benchmarks.parts.step``)."""
