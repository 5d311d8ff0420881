"""Link prediction against PyG's ``LinkNeighborLoader``: ``python -m benchmarks.link`` (the command is ``__main__.py``)."""
