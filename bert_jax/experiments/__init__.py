"""Experiments built from the library: the families' equal-compute comparison (compare)."""
