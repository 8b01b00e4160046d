"""Run-directory layout and the per-rank trace record format (gate + workload).

Pure Python: never imports torch or ray. ``layout`` names the relative paths
of a run directory; ``trace`` writes and reads per-rank trace artifacts.
"""
