"""Heterogeneous node classification end to end: ``ZeroCopyHeteroDataModule`` against PyG's hetero ``NeighborLoader``."""
