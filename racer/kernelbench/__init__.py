"""Micro-benchmarks of the verify forward: one model set-up against another, interleaved in one
run (linear kernels, attention kernels, KV caches, decoder layers, dtypes). Each module is a
command, `python -m racer.kernelbench.NAME --help`, that prints a markdown table; the decoding
benchmark itself is racer.bench."""
