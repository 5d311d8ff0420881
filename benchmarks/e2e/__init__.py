"""End-to-end training against PyG's ``NeighborLoader``: ``python -m benchmarks.e2e`` (the command is ``__main__.py``)."""
