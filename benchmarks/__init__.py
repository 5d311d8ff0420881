"""Benchmarks, one folder per question; ``benchmarks/README.md`` says what each measures, its command and its run time.

Nothing here is imported by ``lightning_zerocopy``; every benchmark runs from a checkout (``python -m benchmarks.<name>``).
"""
