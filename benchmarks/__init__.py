"""Benchmarks, grouped by the question each answers: ``end_to_end/`` (how fast training runs end to end), ``scaling/``
(how it scales over GPUs), ``inference/`` (how fast inference is), ``parts/`` (how fast one part is), ``common/``
(shared code); ``benchmarks/README.md`` says what each measures, its command and its run time.

Nothing here is imported by ``lightning_zerocopy``; every benchmark runs from a checkout (``python -m benchmarks.<name>``).
"""
