"""End-to-end training against PyG's loaders: ``python -m benchmarks.e2e`` (node classification; the command is
``__main__.py``) and ``python -m benchmarks.e2e.hetero`` (a heterogeneous graph)."""
