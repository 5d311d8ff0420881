"""One script per question about one part of the data path: ``python -m benchmarks.micro.<name>``."""
