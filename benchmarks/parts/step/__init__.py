"""The training step on pre-staged batches: ``python -m benchmarks.parts.step`` (the command is ``__main__.py``)."""
