"""What several benchmarks share: picking rows by name, writing results, child runs in sessions of their own, the
machine a run was on, the training clocks and checks, and the PyG baseline's helpers. Imports no benchmark folder."""
