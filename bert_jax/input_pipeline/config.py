"""Defaults of `config.data` and `config.masking` per model family: how each paper builds its training examples.

bert: NSP pairs, static masks (dupe_factor 10); roberta: full-sentence packing, dynamic masks; albert: SOP pairs with
n-gram masking (n <= 3); electra: dynamic MLM inputs for the generator (85% [MASK], 15% kept), no sentence label.
Paths may be local or bucket URLs (gs://...); relative local paths fall back to the repository root
(`resolve_path`), so the tiny presets run from any directory.
"""
from __future__ import annotations

import pathlib

import ml_collections

from bert_jax import storage

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE_KINDS = ("nsp_pairs", "sop_pairs", "full_sentences", "doc_sentences")
MASKING_MODES = ("static", "dynamic")

SAMPLE_CORPUS = "data/corpus/*.txt"
# The tokenizer each family uses: (kind, path of the tiny preset, path of the full-size presets).
TOKENIZERS = {
    "bert": ("wordpiece", "data/bert-base-uncased/vocab.txt", "data/bert-base-uncased/vocab.txt"),
    "electra": ("wordpiece", "data/bert-base-uncased/vocab.txt", "data/bert-base-uncased/vocab.txt"),
    # No 30k ALBERT / 50k GPT-2 vocabulary ships with the repo: set config.data.tokenizer_path for full-size runs.
    "albert": ("sentencepiece", "data/albert-sp8k/spiece.model", ""),
    "roberta": ("bpe", "data/roberta-bpe8k", ""),
}
# ELECTRA's own data builder packs sentences without crossing documents, hence doc_sentences.
EXAMPLE_KIND = {"bert": "nsp_pairs", "roberta": "full_sentences", "albert": "sop_pairs", "electra": "doc_sentences"}


def data_config(family: str, size: str) -> ml_collections.ConfigDict:
    """Where the text comes from and how examples are shaped. Tiny presets read the bundled sample corpus."""
    kind, tiny_path, full_path = TOKENIZERS[family]
    tiny = size == "tiny"
    return ml_collections.ConfigDict(dict(
        tokenizer_kind=kind,
        tokenizer_path=tiny_path if tiny else full_path,
        lowercase=True,  # wordpiece only; sentencepiece and bpe carry their normalization in the model files
        # Either a folder written by `prepare`, or text files tokenized when the pipeline starts, read as `prepare`
        # reads them (comma-separated globs; meant for small corpora such as the sample one: the tokens stay in
        # memory).
        prepared_dir="",
        input_files=SAMPLE_CORPUS if tiny else "",
        example_kind=EXAMPLE_KIND[family],
        seq_length=128,
        batch_size=32 if tiny else 256,  # global batch; each host yields batch_size // process_count
        short_seq_prob=0.1,  # pairs: chance of a shorter target length, as in BERT
        shuffle=True,  # a full permutation of the examples every epoch (stateless, no buffer)
        prefetch_batches=4,
    ))


def masking_config(family: str) -> ml_collections.ConfigDict:
    """MLM masking: which tokens are predicted, and what replaces them in the input."""
    electra = family == "electra"
    return ml_collections.ConfigDict(dict(
        mode="static" if family == "bert" else "dynamic",
        dupe_factor=10,  # static only: epoch e uses mask copy e mod dupe_factor
        rate=0.15,  # of the non-special tokens, rounded, at least 1
        max_predictions_per_seq=20,
        whole_word=family == "albert",
        ngram_max=3 if family == "albert" else 1,  # span lengths n <= ngram_max with p(n) proportional to 1/n
        mask_token_prob=0.85 if electra else 0.8,
        random_token_prob=0.0 if electra else 0.1,  # the rest keeps the original token
    ))


def resolve_path(path: storage.PathLike) -> storage.Path:
    """A bucket URL as it is; a relative local path names a file under the working directory if there is one,
    else under the repository root."""
    p = storage.as_path(path)
    return p if storage.is_remote(p) or p.is_absolute() or p.exists() else storage.as_path(REPO_ROOT) / p
