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
