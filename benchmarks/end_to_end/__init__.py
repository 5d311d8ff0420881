"""How fast does training run end to end, against PyG's loaders: ``python -m benchmarks.end_to_end`` (node
classification; the command is ``__main__.py``), ``python -m benchmarks.end_to_end.link`` (link prediction) and
``python -m benchmarks.end_to_end.hetero`` (a heterogeneous graph). This package's modules are the node benchmark and
what the two others reuse (rows, the one-model training and report); the subpackages import it, never the reverse."""
