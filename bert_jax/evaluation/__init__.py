"""Evaluation: the official SQuAD scorer, GLUE metrics, and zero-shot similarity (each usable without a model)."""
