"""Documents: reading them from text files, tokenizing them, and their record format in prepared shards.

Text format (BERT's): one sentence or paragraph per line, a blank line between documents. JSON-lines files
(`*.jsonl`, `*.json`, as C4 and OpenWebText ship) hold one document per line, its text under a key, one sentence
per non-empty line of it; parquet files (`*.parquet`, as the hub ships FineWeb and Wikipedia) hold one document per
row, its text in a column; TFDS examples are read the same way (`text_documents`). Text and JSON lines may be gzip
(`.gz`) or bzip2 (`.bz2`) compressed. Both `prepare` drivers, `train_tokenizer` and the pipeline's
`config.data.input_files` read through `read_documents`. Memory is bounded whatever the input: a line is read at
most MAX_LINE_BYTES at a time (a JSON record at most MAX_RECORD_BYTES, parquet a row group), a document holds at
most MAX_DOCUMENT_CHARS characters, and the tokenizer gets about ENCODE_BATCH_CHARS at once. Bad input is skipped
or cut and counted, never fatal mid-run; the first few of each kind are named (file:line) in `Counts.where` (and
the first invalid or long line is logged):
  empty_files                 files with no text at all
  invalid_utf8_lines          lines that are not UTF-8
  one_sentence_documents      documents with fewer than two non-empty sentences (no sentence pair can come of them)
  long_documents_split        documents cut into several at MAX_DOCUMENT_LINES lines or MAX_DOCUMENT_CHARS chars
  long_lines_split            lines of MAX_LINE_BYTES or more, cut into pieces (each a sentence) at their last
                              space within the limit, or between two UTF-8 characters when there is none
  unreadable_files            files that could not be opened or decompressed (`prepare` counts them and goes on)
  invalid_records             JSON lines that are not an object with a string under the text key, parquet rows
                              whose text is null
  long_records_skipped        JSON lines of MAX_RECORD_BYTES or more
  empty_records               JSON records or TFDS examples without any text
A shard record is a `tf.train.Example` with `token_ids` (the document's tokens, flat) and `sentence_lengths`.
"""
from __future__ import annotations

import bz2
import collections
import gzip
import io
import itertools
import json
import os
import zlib
from typing import BinaryIO, Callable, Iterable, Iterator

import numpy as np
from absl import logging

from bert_jax import data_sources, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import config as config_lib

SKIP_COUNTS = ("empty_files", "invalid_utf8_lines", "one_sentence_documents", "long_documents_split",
               "long_lines_split", "unreadable_files", "invalid_records", "long_records_skipped", "empty_records")
MAX_NAMED = 10  # places named per kind of skip: enough to find the culprits, bounded on a 160 GB corpus
JSON_SUFFIXES = (".jsonl", ".json")
# Tokenizers need ~170 bytes per byte of one long line but ~40 per byte of 64 KiB lines (and are faster on them).
MAX_LINE_BYTES = 1 << 16
MAX_DOCUMENT_LINES = 10_000
MAX_DOCUMENT_CHARS = 1 << 20
MAX_RECORD_BYTES = 1 << 24  # a JSON line is parsed whole: 16 MiB holds any real web page
# How much text goes to the tokenizer at once: large batches let the Rust/C++ tokenizers use their fast paths.
ENCODE_BATCH_LINES = 8192
ENCODE_BATCH_CHARS = 1 << 20
READ_BUFFER_BYTES = 1 << 20  # a bucket file's own line reading would copy a whole block for every line
PARSE_BATCH_RECORDS = 1024  # shard records parsed by one tf.io.parse_example call
UTF8_CONTINUATION = 0b1000_0000  # the top bits 10 mark a byte inside a character, never the first one


class InputFilesError(UserError, FileNotFoundError):
    """Input text files that are missing or match no file; the message names the config key or flag."""


class NoDocumentsError(UserError, ValueError):
    """Too few usable documents; the message says how much input was skipped, and why."""


class UnreadableFileError(UserError, OSError):
    """An input file that cannot be opened or decompressed; the message names it."""


class Counts(collections.Counter):
    """Counters for a summary, and where the first MAX_NAMED skips of each kind happened ("file:line")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.where: dict[str, list[str]] = {}

    def note(self, kind: str, place: str) -> None:
        """Count one skip of `kind` at `place`, naming the place while fewer than MAX_NAMED are named."""
        self[kind] += 1
        named = self.where.setdefault(kind, [])
        if len(named) < MAX_NAMED and place not in named:
            named.append(place)


def new_counts() -> Counts:
    """Counters for a summary: documents, sentences, tokens and the skip counts."""
    return Counts({k: 0 for k in ("documents", "sentences", "tokens", *SKIP_COUNTS)})


def expand_patterns(patterns: str, key: str) -> list[storage.Path]:
    """Comma-separated globs (local or gs://) -> sorted files; a pattern matching nothing is an error naming the
    config key. A relative local pattern that matches nothing here is tried under the repository root."""
    files = []
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        matches = storage.glob(pattern)
        if not matches and not storage.is_remote(pattern) and not os.path.isabs(os.path.expanduser(pattern)):
            matches = storage.glob(os.path.join(config_lib.REPO_ROOT, pattern))
        if not matches:
            raise InputFilesError(f"{key}: {pattern!r} matches no file; check the path (comma-separated globs)")
        files.extend(matches)
    if not files:
        raise InputFilesError(f"{key} is empty: give text files (comma-separated globs)")
    return files


def require_files(files: list[storage.PathLike], what: str) -> None:
    """Fail before any work when a named input file is missing; `what` names the flag or key they came from."""
    if not files:
        raise InputFilesError(f"{what}: no input files given; name the text files to read")
    if missing := [os.fspath(f) for f in files if not storage.as_path(f).is_file()]:
        raise InputFilesError(f"{what}: input files not found: {missing}; check the paths")


def piece_end(chunk: bytes) -> int:
    """Where to cut a full chunk of an over-long line: after its last space or tab, else after its last byte when
    that is ASCII, else before its last character starts (the cut-off bytes begin the next piece), so that no UTF-8
    character is ever split."""
    space = max(chunk.rfind(b" "), chunk.rfind(b"\t"))
    if space > 0:
        return space + 1
    if chunk[-1] < 0x80:
        return len(chunk)
    for end in range(len(chunk) - 1, max(0, len(chunk) - 5), -1):  # a character has at most 4 bytes
        if chunk[end] & 0b1100_0000 != UTF8_CONTINUATION:
            return end
    return len(chunk)  # no character starts near the end: not UTF-8 anyway


def read_lines(stream: BinaryIO, name: str, counts: Counts) -> Iterator[str]:
    """The stripped lines of a binary stream ("" for a blank one), holding at most MAX_LINE_BYTES of it: a longer
    line arrives as several pieces (`piece_end`). Lines that are not UTF-8 are skipped. `name` labels the log."""
    line_number, carry, long_line = 1, b"", 0
    while chunk := carry + stream.readline(MAX_LINE_BYTES - len(carry)):
        carry = b""
        if len(chunk) == MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            end = piece_end(chunk)
            chunk, carry = chunk[:end], chunk[end:]
            if long_line != line_number:
                long_line = line_number
                _count_long_line(name, line_number, counts)
        try:
            text = chunk.decode("utf-8").strip()
            if text or long_line != line_number:  # a blank piece of a long line is no document break
                yield text
        except UnicodeDecodeError as e:
            if not counts["invalid_utf8_lines"]:
                logging.warning("%s:%d: invalid UTF-8 (%s); skipping such lines (counted)", name, line_number, e)
            counts.note("invalid_utf8_lines", f"{name}:{line_number}")
        line_number += chunk.endswith(b"\n")


def _count_long_line(name: str, line_number: int, counts: Counts) -> None:
    if not counts["long_lines_split"]:
        logging.warning("%s:%d: a line of %d bytes or more; cutting such lines into pieces (counted)", name,
                        line_number, MAX_LINE_BYTES)
    counts.note("long_lines_split", f"{name}:{line_number}")


def group_documents(lines: Iterable[str], counts: collections.Counter) -> Iterator[list[str]]:
    """Documents (lists of non-empty lines) ended by blank lines, or cut when they reach MAX_DOCUMENT_LINES lines
    or MAX_DOCUMENT_CHARS characters, so that a file without blank lines cannot fill memory."""
    doc, size, cut = [], 0, False
    for line in lines:
        counts["long_documents_split"] += cut and bool(line)  # counted once the cut document goes on
        cut = False
        if line:
            doc.append(line)
            size += len(line)
        if doc and (not line or len(doc) == MAX_DOCUMENT_LINES or size >= MAX_DOCUMENT_CHARS):
            cut = bool(line)
            yield doc
            doc, size = [], 0
    if doc:
        yield doc


def is_json_lines(path: storage.PathLike) -> bool:
    """Whether a file holds JSON lines, by its name (before a .gz or .bz2)."""
    return os.fspath(path).removesuffix(".gz").removesuffix(".bz2").endswith(JSON_SUFFIXES)


def is_parquet(path: storage.PathLike) -> bool:
    return os.fspath(path).endswith(".parquet")


def has_records(path: storage.PathLike) -> bool:
    """Whether a file holds one document per record (JSON lines, parquet rows) with its text under a key."""
    return is_json_lines(path) or is_parquet(path)


def read_file(path: storage.PathLike, read: Callable[[BinaryIO], Iterator]) -> Iterator:
    """`read(stream)` on a file (local or gs://), decompressed by its suffix; a file that cannot be opened or
    decompressed is an UnreadableFileError naming it, whenever that shows."""
    name = os.fspath(path)
    try:
        with storage.as_path(path).open("rb") as raw:
            stream = io.BufferedReader(raw, READ_BUFFER_BYTES)
            if name.endswith(".gz"):
                stream = gzip.GzipFile(fileobj=stream)
            elif name.endswith(".bz2"):
                stream = bz2.BZ2File(stream)
            yield from read(stream)
    except (OSError, EOFError, zlib.error) as e:
        raise UnreadableFileError(f"{name}: cannot read it ({type(e).__name__}: {e})") from e


def file_lines(path: storage.PathLike, counts: Counts) -> Iterator[str]:
    """The lines of one text file (local or gs://, maybe compressed), as `read_lines` gives them."""
    return read_file(path, lambda stream: read_lines(stream, os.fspath(path), counts))


def text_documents(text: bytes, name: str, counts: Counts) -> Iterator[list[str]]:
    """The documents of one record's text (a JSON line's, a TFDS example's): its non-empty lines, read like a
    file's (long ones cut, invalid UTF-8 skipped); usually one document, more when it is cut."""
    empty = True
    for doc in group_documents(filter(None, read_lines(io.BytesIO(text), name, counts)), counts):
        empty = False
        yield doc
    if empty:
        counts.note("empty_records", name)


def json_records(stream: BinaryIO, name: str, text_key: str, counts: Counts) -> Iterator[list[str]]:
    """The documents of a JSON-lines stream, one record's text under `text_key` at a time (`text_documents`);
    records that are too long, not UTF-8, not JSON or without that text are skipped and counted."""
    line_number = 0
    while line := stream.readline(MAX_RECORD_BYTES):
        line_number += 1
        place = f"{name}:{line_number}"
        if not line.endswith(b"\n") and len(line) == MAX_RECORD_BYTES:
            while (rest := stream.readline(MAX_RECORD_BYTES)) and not rest.endswith(b"\n"):
                pass  # the rest of the record, dropped piece by piece
            counts.note("long_records_skipped", place)
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            counts.note("invalid_utf8_lines", place)
            continue
        except ValueError:
            record = None
        text = record.get(text_key) if isinstance(record, dict) else None
        if not isinstance(text, str):
            counts.note("invalid_records", place)
            continue
        yield from text_documents(text.encode("utf-8"), place, counts)


def parquet_records(path: storage.PathLike, text_key: str, counts: Counts) -> Iterator[list[str]]:
    """The documents of a parquet file, one row's text in the `text_key` column at a time (`text_documents`),
    read a batch of rows at a time; rows whose text is null are skipped and counted."""
    row = 0
    hint = "name the text column with --text_key (config.data.input_files reads 'text')"
    for batch in data_sources.parquet_columns(path, [text_key], hint):
        for text in batch[text_key]:
            place = f"{os.fspath(path)}:row {row}"
            row += 1
            if not isinstance(text, str):
                counts.note("invalid_records", place)
                continue
            yield from text_documents(text.encode("utf-8"), place, counts)


def read_documents(path: storage.PathLike, counts: Counts, text_key: str = "text") -> Iterator[list[str]]:
    """Stream the documents of one file (local or gs://; text, or JSON lines or parquet with their text under
    `text_key`) as lists of lines; skips are added to `counts`."""
    empty = True
    if is_parquet(path):
        docs = parquet_records(path, text_key, counts)
    elif is_json_lines(path):
        docs = read_file(path, lambda stream: json_records(stream, os.fspath(path), text_key, counts))
    else:
        docs = group_documents(file_lines(path, counts), counts)
    for doc in docs:
        empty = False
        yield doc
    if empty:
        logging.warning("%s: empty file, skipped (counted)", path)
        counts.note("empty_files", os.fspath(path))


def tokenize_files(files: Iterable[storage.PathLike], tokenizer,
                   counts: Counts) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The tokenized documents of text files, in order: what `prepare` writes and `data.input_files` trains on."""
    return tokenize_documents((doc for f in files for doc in read_documents(f, counts)), tokenizer, counts)


def tokenize_documents(documents: Iterable[list[str]], tokenizer,
                       counts: collections.Counter) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(token_ids int32[T], sentence_lengths int32[N]) per document, tokenized in batches of about
    ENCODE_BATCH_LINES lines or ENCODE_BATCH_CHARS characters, whichever comes first."""
    buffer, lines, size = [], 0, 0
    for doc in documents:
        buffer.append(doc)
        lines, size = lines + len(doc), size + sum(map(len, doc))
        if lines >= ENCODE_BATCH_LINES or size >= ENCODE_BATCH_CHARS:
            yield from _tokenize_buffer(buffer, tokenizer, counts)
            buffer, lines, size = [], 0, 0
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


def describe_counts(counts: collections.Counter, sources: str) -> str:
    """One line for a user: "0 documents from 1 file: 1 line of 65536 bytes or more split, ..." (the non-zero
    skip counts; `sources` says what was read, e.g. "1 file")."""
    why = {
        "empty_files": ("empty file", ""),
        "invalid_utf8_lines": ("line", " of invalid UTF-8 skipped"),
        "one_sentence_documents": ("one-sentence document", " skipped"),
        "long_documents_split": ("document", f" of {MAX_DOCUMENT_LINES} lines or {MAX_DOCUMENT_CHARS} chars split"),
        "long_lines_split": ("line", f" of {MAX_LINE_BYTES} bytes or more split"),
        "unreadable_files": ("unreadable file", " skipped"),
        "invalid_records": ("JSON line", " without text skipped"),
        "long_records_skipped": ("JSON line", f" of {MAX_RECORD_BYTES} bytes or more skipped"),
        "empty_records": ("record", " without text skipped"),
    }
    skips = [f"{plural(counts[k], noun)}{rest}" for k, (noun, rest) in why.items() if counts[k]]
    return f"{plural(counts['documents'], 'document')} from {sources}" + (": " + ", ".join(skips) if skips else "")


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def check_enough_documents(counts: collections.Counter, needed: int, sources: str, where: str) -> None:
    """Raise NoDocumentsError, saying why, when fewer than `needed` documents were usable; `where` names the flag
    or config key that gave the input."""
    if counts["documents"] < needed:
        raise NoDocumentsError(f"{where}: {describe_counts(counts, sources)} ({needed} needed); give text with one "
                               "sentence per line and a blank line between documents of two or more sentences")


def serialize(token_ids: np.ndarray, sentence_lengths: np.ndarray) -> bytes:
    """The document as a serialized `tf.train.Example`, byte for byte what TensorFlow writes with
    `SerializeToString(deterministic=True)` (features in key order), encoded here: preparing a corpus then needs no
    TensorFlow, whose import costs each worker process about 5 CPU seconds and 0.7 GB."""
    features = b"".join(_length_delimited(1, _length_delimited(1, key) + _length_delimited(2, _int64_feature(values)))
                        for key, values in (("sentence_lengths", sentence_lengths), ("token_ids", token_ids)))
    return _length_delimited(1, features)


def _length_delimited(field: int, payload: bytes | str) -> bytes:
    """A protobuf field of wire type 2 (a message, a string or packed numbers)."""
    payload = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    """A protobuf varint: 7 bits a byte, low bits first, the high bit set on every byte but the last."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int64_feature(values: np.ndarray) -> bytes:
    """A Feature holding an Int64List (field 3) of `values`, packed; an empty list has no field at all."""
    values = np.asarray(values, np.int64).ravel()
    return _length_delimited(3, _length_delimited(1, _varints(values.view(np.uint64))) if values.size else b"")


_VARINT_LIMITS = np.uint64(1) << np.arange(7, 64, 7, dtype=np.uint64)  # the smallest values of 2, 3, ... 10 bytes


def _varints(values: np.ndarray) -> bytes:
    """The `_varint`s of uint64 values, end to end (negative int64s as their two's complement, as protobuf writes
    them), vectorised over the values: a document's tokens would take longer one by one than their tokenizing."""
    sizes = np.searchsorted(_VARINT_LIMITS, values, side="right") + 1
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(starts[-1] + sizes[-1]), np.uint8)
    for k in range(int(sizes.max())):
        has = sizes > k
        chunk = ((values[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[has] + k] = chunk | np.where(sizes[has] > k + 1, 0x80, 0).astype(np.uint8)
    return out.tobytes()


def read_shards(paths: list[storage.PathLike]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The documents of prepared shards (local or gs://), in order, as `tokenize_documents` yields them."""
    import tensorflow as tf
    spec = {k: tf.io.RaggedFeature(tf.int64) for k in ("token_ids", "sentence_lengths")}
    records = (record for path in paths for record in storage.read_records(path))
    while batch := list(itertools.islice(records, PARSE_BATCH_RECORDS)):
        parsed = tf.io.parse_example(tf.constant(batch), spec)
        tokens, lengths = (_rows(parsed[k]) for k in ("token_ids", "sentence_lengths"))
        yield from zip(tokens, lengths)


def _rows(ragged) -> list[np.ndarray]:
    """The rows of a parsed [batch, None] feature (a tf.RaggedTensor) as int32 arrays."""
    values, splits = ragged.values.numpy().astype(np.int32), ragged.row_splits.numpy()
    return [values[start:end] for start, end in zip(splits[:-1], splits[1:])]
