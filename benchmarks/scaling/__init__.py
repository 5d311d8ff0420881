"""GPUs x cache policy x budget through ``ZeroCopyDDPStrategy``: ``python -m benchmarks.scaling`` (``__main__.py``)."""
