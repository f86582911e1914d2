"""Training pairs for embeddings: (query, positive) or (query, positive, negative) texts from JSON lines or parquet.

Each row holds strings under `query` and `positive`, and optionally `negative` (a hard negative: a text that looks
relevant and is not). Files are local or in a bucket, named by comma-separated globs (`storage.glob`); `.parquet`
files are read with pyarrow, anything else as JSON lines. Either every row has a negative or none has.
"""
from __future__ import annotations

import dataclasses
import io

from bert_jax import data_sources, storage
from bert_jax.errors import UserError

COLUMNS = ("query", "positive", "negative")


class PairsDataError(UserError, ValueError):
    """A pairs file that cannot be read, or a row without a text it needs; the message names the file and row."""


@dataclasses.dataclass(frozen=True)
class Pairs:
    query: list[str]
    positive: list[str]
    negative: list[str] | None  # None: no hard negatives


def read_pairs(patterns: str) -> Pairs:
    """All rows of the files the comma-separated globs match, in order."""
    files = [file for pattern in patterns.split(",") if pattern.strip() for file in storage.glob(pattern.strip())]
    if not files:
        raise PairsDataError(f"config.train_files={patterns!r} matches no file; give JSON lines or parquet files "
                             "with 'query' and 'positive' (and optionally 'negative') texts")
    rows = [(f"{file}, {where}", row) for file in files for where, row in read_rows(file)]
    with_negative = [where for where, row in rows if row.get("negative") is not None]
    if with_negative and len(with_negative) != len(rows):
        missing = next(where for where, row in rows if row.get("negative") is None)
        raise PairsDataError(f"{missing}: no 'negative', while {with_negative[0]} has one; give every row a hard "
                             "negative or none")
    columns = COLUMNS if with_negative else COLUMNS[:2]
    texts = {name: [text_of(row, name, where) for where, row in rows] for name in columns}
    return Pairs(texts["query"], texts["positive"], texts.get("negative"))


def read_rows(file: storage.Path):
    """(where, row dict) of a parquet or JSON lines file; `where` is the row number (parquet) or the line."""
    try:
        data = file.read_bytes()
    except OSError as e:
        raise PairsDataError(str(storage.explain(file, e))) from e
    if file.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data))
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own error types for damaged files
            raise PairsDataError(f"{file}: not a readable parquet file ({e})") from e
        yield from ((f"row {i + 1}", row) for i, row in enumerate(table.to_pylist()))
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PairsDataError(f"{file}: not UTF-8 text ({e}); JSON lines files are UTF-8") from e
    for number, row in data_sources.json_lines(text.splitlines(), str(file), PairsDataError):
        if not isinstance(row, dict):
            raise PairsDataError(f"{file}:{number}: a JSON {type(row).__name__}, not an object with 'query' and "
                                 "'positive' texts")
        yield f"line {number}", row


def text_of(row, column: str, where: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get(column), str):
        raise PairsDataError(f"{where}: {column!r} is missing or not a string; every row needs 'query' and "
                             "'positive' texts")
    return row[column]
