"""Documents: reading them from text files, tokenizing them, and their record format in prepared shards.

Text format (BERT's): one sentence or paragraph per line, a blank line between documents. Reading streams line by
line, so memory does not grow with the file. Bad input is skipped and counted, never fatal mid-run:
  empty_files                 files with no text at all
  invalid_utf8_lines          lines that are not UTF-8 (the first one is logged with file and line number)
  one_sentence_documents      documents with fewer than two non-empty sentences (no sentence pair can come of them)
and documents of more than MAX_DOCUMENT_LINES lines are cut into several (`long_documents_split`), so that a file
without blank lines cannot fill memory.
A shard record is a `tf.train.Example` with `token_ids` (the document's tokens, flat) and `sentence_lengths`.
"""
from __future__ import annotations

import collections
import io
import itertools
import os
from typing import Iterable, Iterator

import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax import storage
from bert_jax.input_pipeline import config as config_lib

SKIP_COUNTS = ("empty_files", "invalid_utf8_lines", "one_sentence_documents", "long_documents_split")
MAX_DOCUMENT_LINES = 10_000
# How many lines go to the tokenizer at once: large batches let the Rust/C++ tokenizers use their fast paths.
ENCODE_BATCH_LINES = 8192
PARSE_BATCH_RECORDS = 1024  # shard records parsed by one tf.io.parse_example call


def new_counts() -> collections.Counter:
    """Counters for a summary: documents, sentences, tokens and the skip counts."""
    return collections.Counter({k: 0 for k in ("documents", "sentences", "tokens", *SKIP_COUNTS)})


def expand_patterns(patterns: str, key: str) -> list[storage.Path]:
    """Comma-separated globs (local or gs://) -> sorted files; a pattern matching nothing is an error naming the
    config key. A relative local pattern that matches nothing here is tried under the repository root."""
    files = []
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        matches = storage.glob(pattern)
        if not matches and not storage.is_remote(pattern) and not os.path.isabs(os.path.expanduser(pattern)):
            matches = storage.glob(os.path.join(config_lib.REPO_ROOT, pattern))
        if not matches:
            raise FileNotFoundError(f"{key}: {pattern!r} matches no file")
        files.extend(matches)
    if not files:
        raise FileNotFoundError(f"{key} is empty: give text files (comma-separated globs)")
    return files


def read_documents(path: storage.PathLike, counts: collections.Counter) -> Iterator[list[str]]:
    """Stream the documents of one text file (local or gs://) as lists of lines; skips are added to `counts`."""
    doc, seen_text = [], False
    with storage.as_path(path).open("rb") as f:
        # Buffered here: a bucket file's own line reading copies a whole block for every line.
        for line_number, raw in enumerate(io.BufferedReader(f, 1 << 20), 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                if not counts["invalid_utf8_lines"]:
                    logging.warning("%s:%d: invalid UTF-8 (%s); skipping such lines (counted)", path, line_number, e)
                counts["invalid_utf8_lines"] += 1
                continue
            seen_text |= bool(line)
            if line:
                doc.append(line)
            if doc and (not line or len(doc) == MAX_DOCUMENT_LINES):
                counts["long_documents_split"] += bool(line)
                yield doc
                doc = []
    if doc:
        yield doc
    if not seen_text:
        logging.warning("%s: empty file, skipped (counted)", path)
        counts["empty_files"] += 1


def tokenize_documents(documents: Iterable[list[str]], tokenizer,
                       counts: collections.Counter) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(token_ids int32[T], sentence_lengths int32[N]) per document, tokenized in large batches of lines."""
    buffer = []
    for doc in documents:
        buffer.append(doc)
        if sum(map(len, buffer)) >= ENCODE_BATCH_LINES:
            yield from _tokenize_buffer(buffer, tokenizer, counts)
            buffer = []
    yield from _tokenize_buffer(buffer, tokenizer, counts)


def _tokenize_buffer(buffer, tokenizer, counts):
    lines = [line for doc in buffer for line in doc]
    encoded = iter(tokenizer.encode_batch(lines)) if lines else iter(())
    for doc in buffer:
        sentences = [ids for ids in (next(encoded) for _ in doc) if ids]
        if len(sentences) < 2:
            counts["one_sentence_documents"] += 1
            continue
        counts.update(documents=1, sentences=len(sentences), tokens=sum(map(len, sentences)))
        yield (np.concatenate(sentences).astype(np.int32), np.array([len(s) for s in sentences], np.int32))


def serialize(token_ids: np.ndarray, sentence_lengths: np.ndarray) -> bytes:
    feature = dict(token_ids=tf.train.Feature(int64_list=tf.train.Int64List(value=token_ids)),
                   sentence_lengths=tf.train.Feature(int64_list=tf.train.Int64List(value=sentence_lengths)))
    # deterministic: protobuf's map order otherwise changes from process to process, and so would the shards.
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def read_shards(paths: list[storage.PathLike]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The documents of prepared shards (local or gs://), in order, as `tokenize_documents` yields them."""
    spec = {k: tf.io.RaggedFeature(tf.int64) for k in ("token_ids", "sentence_lengths")}
    records = (record for path in paths for record in storage.read_records(path))
    while batch := list(itertools.islice(records, PARSE_BATCH_RECORDS)):
        parsed = tf.io.parse_example(tf.constant(batch), spec)
        tokens, lengths = (_rows(parsed[k]) for k in ("token_ids", "sentence_lengths"))
        yield from zip(tokens, lengths)


def _rows(ragged: tf.RaggedTensor) -> list[np.ndarray]:
    """The rows of a parsed [batch, None] feature as int32 arrays."""
    values, splits = ragged.values.numpy().astype(np.int32), ragged.row_splits.numpy()
    return [values[start:end] for start, end in zip(splits[:-1], splits[1:])]
