"""Benchmark scripts, each run as ``python bench/<name>.py``; importable as ``bench.<name>`` so the
tests can check their pure pieces (grids, tables, accuracy cases) without running them."""
