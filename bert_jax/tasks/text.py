"""Packing one or two token sequences into a model input, the way each family's tokenizer does.

BERT, ALBERT, ELECTRA: [CLS] a [SEP] b [SEP], token types 0 then 1. RoBERTa: <s> a </s></s> b </s>, all type 0
(its embeddings have a single token type); families.Family says which.
"""
from __future__ import annotations

import numpy as np

from bert_jax import families


def special_count(family: str, pair: bool) -> int:
    """How many special tokens a single text or a pair takes."""
    if not pair:
        return 2
    return 2 + families.get(family).pair_separators


def pack(ids_a: list[int], ids_b: list[int] | None, special, family: str) -> tuple[list[int], list[int]]:
    """(input_ids, token_type_ids) of one example; `special` holds the tokenizer's cls and sep ids."""
    single = [special.cls, *ids_a, special.sep]
    if ids_b is None:
        return single, [0] * len(single)
    spec = families.get(family)
    first, second = single + [special.sep] * (spec.pair_separators - 1), [*ids_b, special.sep]
    return first + second, [0] * len(first) + [int(spec.pair_token_types)] * len(second)


def truncate_longest_first(ids_a: list[int], ids_b: list[int] | None, budget: int):
    """Drop tokens from the end of the longer text until both fit in `budget` tokens (BERT's rule)."""
    ids_a, ids_b = list(ids_a), None if ids_b is None else list(ids_b)
    while len(ids_a) + len(ids_b or []) > budget:
        longer = ids_b if ids_b is not None and len(ids_b) > len(ids_a) else ids_a
        longer.pop()
    return ids_a, ids_b


def pad_rows(rows: list[list[int]], length: int, pad_id: int) -> np.ndarray:
    out = np.full((len(rows), length), pad_id, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def encode_texts(tokenizer, family: str, texts_a: list[str], texts_b: list[str] | None, max_length: int):
    """Model inputs [N, max_length] for single texts or pairs, and how many examples had to be truncated."""
    pair = texts_b is not None
    all_a = tokenizer.encode_batch(list(texts_a))
    all_b = tokenizer.encode_batch(list(texts_b)) if pair else [None] * len(all_a)
    budget = max_length - special_count(family, pair)
    ids, types, truncated = [], [], 0
    for a, b in zip(all_a, all_b):
        truncated += len(a) + len(b or []) > budget
        i, t = pack(*truncate_longest_first(a, b, budget), tokenizer.special, family)
        ids.append(i)
        types.append(t)
    lengths = np.array([len(i) for i in ids])
    features = {"input_ids": pad_rows(ids, max_length, tokenizer.special.pad),
                "attention_mask": (np.arange(max_length) < lengths[:, None]).astype(np.int32),
                "token_type_ids": pad_rows(types, max_length, 0)}
    return features, truncated
