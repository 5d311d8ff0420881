"""Exact layer-wise inference over every node (issue 41): ours against PyG's ``BasicGNN.inference`` and our sampled
``predict`` (``python -m benchmarks.inference``)."""
