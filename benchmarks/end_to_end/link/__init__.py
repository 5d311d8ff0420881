"""Link prediction against PyG's ``LinkNeighborLoader``: ``python -m benchmarks.end_to_end.link`` (the command is ``__main__.py``)."""
