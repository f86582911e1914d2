"""The values `config.data` and `config.masking` may take (their defaults are in bert_jax.config_lib), and where
their paths point. Paths may be local or bucket URLs (gs://...); relative local paths fall back to the repository
root (`resolve_path`), so the tiny presets run from any directory.
"""
from __future__ import annotations

import pathlib

from bert_jax import storage

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE_KINDS = ("nsp_pairs", "sop_pairs", "full_sentences", "doc_sentences", "packed_documents")
PAIR_KINDS = ("nsp_pairs", "sop_pairs")  # the others pack texts into rows, with packing_segment_ids
MASKING_MODES = ("static", "dynamic")


def resolve_path(path: storage.PathLike) -> storage.Path:
    """A bucket URL as it is; a relative local path names a file under the working directory if there is one,
    else under the repository root."""
    p = storage.as_path(path)
    return p if storage.is_remote(p) or p.is_absolute() or p.exists() else storage.as_path(REPO_ROOT) / p


def masking_rates(masking) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(first steps, rates) of masking.rate_schedule ("STEP:RATE,..."), or ((0,), (masking.rate,)) without one."""
    if not masking.rate_schedule:
        return (0,), (masking.rate,)
    pairs = [item.split(":") for item in masking.rate_schedule.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError("each item must be STEP:RATE")
    steps, rates = tuple(int(step) for step, _ in pairs), tuple(float(rate) for _, rate in pairs)
    if steps[0] != 0 or list(steps) != sorted(set(steps)):
        raise ValueError("the steps must start at 0 and increase")
    if not all(0.0 < rate < 1.0 for rate in rates):
        raise ValueError("every rate must be in (0, 1)")
    return steps, rates
