"""The work of `prepare`, unit by unit: what both drivers run, the local one (`prepare.prepare`, worker processes on
this machine) and the Beam one (`beam_prepare`, many machines).

A unit is one input file or one even slice of a TFDS split, numbered in input order (`work_units`). `prepare_unit`
writes its shards `k-PART.tfrecord` of at most docs_per_shard documents, each beside its name then renamed when
whole, then its marker `k.done.json` with its counts, what it was made from and each shard's size and CRC32C; a
rerun skips the units whose marker matches their input and settings and whose shards still match it (each shard is
read once to check), and prepares the others again, so that rerunning the same command repairs a truncated or
corrupted shard. `summarize` sums the units' counts in unit order, whichever driver ran them in whichever order.
"""
from __future__ import annotations

import collections
import itertools
import json
import os

from absl import logging

from bert_jax import data_sources, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import documents, tokenizers

SUMMARY = "summary.json"


class PrepareError(UserError, ValueError):
    """Input that cannot be prepared; the message names it and what to do."""


def read_tfds_documents(unit: dict, counts: documents.Counts):
    """Documents of one even slice of a TFDS split: each example's text, one sentence per non-empty line, read
    like a JSON line's text (`documents.text_documents`)."""
    import tensorflow_datasets as tfds
    builder = data_sources.tfds_builder(unit["name"], unit["data_dir"], unit_name(unit))
    split = tfds.even_splits(unit["split"], unit["count"])[unit["index"]]
    for i, example in enumerate(builder.as_dataset(split=split).as_numpy_iterator()):
        yield from documents.text_documents(example[unit["text_key"]], f"{unit_name(unit)}[{i}]", counts)


def unit_name(unit: dict) -> str:
    """What a unit reads, for the summary: its file, or its slice of a TFDS split."""
    return unit.get("path") or f"{unit['name']}/{unit['split']}[slice {unit['index']} of {unit['count']}]"


def unit_documents(unit: dict, counts: documents.Counts):
    """The documents of one unit, as both drivers read them."""
    if unit.get("path"):
        return documents.read_documents(unit["path"], counts, unit.get("text_key", "text"))
    return read_tfds_documents(unit, counts)


def made_from(unit: dict) -> dict:
    """What a unit's shards depend on: its settings, the reading limits and, for a file, its size and
    modification time (a cheap stand-in for its content)."""
    reading = dict(max_line_bytes=documents.MAX_LINE_BYTES, max_document_lines=documents.MAX_DOCUMENT_LINES,
                   max_document_chars=documents.MAX_DOCUMENT_CHARS)
    settings = {k: v for k, v in unit.items() if k not in ("output", "id")}
    return dict(settings, **reading, **(input_fingerprint(unit["path"]) if unit.get("path") else {}))


def input_fingerprint(path: str) -> dict:
    """Size and modification time of an input file (nanoseconds locally, seconds in a bucket)."""
    if storage.is_remote(path):
        stat = storage.as_path(path).stat()
        return dict(size=stat.length, mtime=stat.mtime)
    stat = os.stat(path)
    return dict(size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def unit_files(output: storage.Path, prefix: str) -> list[storage.Path]:
    """The shards a unit wrote and a killed writer's leftovers (.NAME.tmp-PID); nothing else in the folder."""
    return [*output.glob(f"{prefix}-[0-9][0-9][0-9][0-9].tfrecord"),
            *output.glob(f".{prefix}-[0-9][0-9][0-9][0-9].tfrecord.tmp-*")]


def prepare_unit(unit: dict) -> dict:
    """Tokenize one unit into its shards; returns its counts (read back from the marker if it was done before
    from the same input and settings, and its shards are still what it wrote)."""
    output, prefix = storage.as_path(unit["output"]), f"{unit['id']:05d}"
    marker, source = output / f"{prefix}.done.json", made_from(unit)
    if marker.exists():
        done = json.loads(marker.read_text())
        changed = changed_shard(output, done) if done.get("made_from") == source else "its input or settings"
        if not changed:
            return done
        logging.warning("prepare: unit %d (%s) is prepared again: %s changed since %s", unit["id"], unit_name(unit),
                        changed, marker)
        marker.unlink()  # first: its old shards must never count as done with new ones
    for stale in unit_files(output, prefix):
        stale.unlink()
    tokenizer = tokenizers.load_tokenizer(unit["tokenizer_kind"], unit["tokenizer"], unit["lowercase"])
    counts = documents.new_counts()
    try:
        files = write_shards(output, prefix, documents.tokenize_documents(unit_documents(unit, counts), tokenizer,
                                                                          counts), unit["docs_per_shard"])
    except documents.UnreadableFileError as e:  # counted and named; no marker, so that a rerun tries it again
        logging.warning("%s; skipped (counted)", e)
        for partial in unit_files(output, prefix):
            partial.unlink()
        counts = documents.new_counts()
        counts.note("unreadable_files", str(e))
        return unit_result(unit, counts, {}, source)
    result = unit_result(unit, counts, files, source)
    storage.atomic_write(marker, json.dumps(result))
    return result


def write_shards(output: storage.Path, prefix: str, docs, docs_per_shard: int) -> dict[str, dict]:
    """Write tokenized documents into shards `prefix-PART.tfrecord`, each written whole then renamed; returns
    {shard name: its size and CRC32C} (storage.fingerprint)."""
    records = (documents.serialize(*doc) for doc in docs)
    files = {}
    for first in records:  # each shard takes its first record and up to docs_per_shard - 1 more from the stream
        name = f"{prefix}-{len(files):04d}.tfrecord"
        written = storage.write_records(output / name,
                                        itertools.chain([first], itertools.islice(records, docs_per_shard - 1)))
        files[name] = {"size": written["size"], "crc32c": written["crc32c"]}
    return files


def changed_shard(output: storage.Path, done: dict) -> str:
    """What of a done unit's shards is missing or no longer what the unit wrote, in words ("" when nothing is):
    each is read whole to compare its size and CRC32C with the marker's."""
    for name, written in done.get("files", {}).items():
        path = output / name
        if not path.exists():
            return f"{path} (missing)"
        found = storage.fingerprint(path)
        if found != written:
            return f"{path} ({found['size']} bytes, {written['size']} written)"
    return ""


def unit_result(unit: dict, counts: documents.Counts, files: dict[str, dict], source: dict) -> dict:
    """A unit's counts, where its skips happened (file:line where known, else the unit's input) and its shards
    with their sizes and checksums."""
    name = unit_name(unit)
    where = {k: counts.where.get(k) or [name] for k in documents.SKIP_COUNTS if counts[k]}
    return dict(counts, shards=len(files), where=where, source=name, made_from=source, files=files)


def prepare_one(unit: dict) -> tuple[int, dict]:
    """(unit id, result): what either driver collects for `summarize`."""
    return unit["id"], prepare_unit(unit)


def summarize(results) -> dict:
    """The job's summary from its units' (id, result) pairs, in unit order whatever order they finished in: summed
    counts and the first MAX_NAMED places of each kind of skip."""
    totals, where = collections.Counter(), {}
    for _, result in sorted(results, key=lambda pair: pair[0]):
        totals.update({k: v for k, v in result.items() if isinstance(v, int)})
        for kind, places in result.get("where", {}).items():
            where[kind] = (where.get(kind, []) + places)[:documents.MAX_NAMED]
    return dict(totals, where=where)


def save_summary(summary: dict, output: str) -> dict:
    """Write DIR/summary.json (by the driver: this process, or a Beam worker)."""
    storage.atomic_write(storage.as_path(output) / SUMMARY, json.dumps(summary, indent=1))
    return summary


def work_units(inputs: list[str], output: storage.PathLike, tokenizer: str, tokenizer_kind: str, lowercase: bool,
               docs_per_shard: int, text_key: str = "text", tfds_data_dir: str | None = None,
               tfds_units: int = 64) -> list[dict]:
    """All units of the job, numbered in input order: a unit per file (a glob's matches and a folder's parquet
    files sorted), `tfds_units` even slices per tfds:NAME[:SPLIT] input. Creates the output folder and checks that
    it can be written (a missing bucket or permission fails here, once, not in every worker)."""
    common = dict(output=str(output), tokenizer=tokenizer, tokenizer_kind=tokenizer_kind, lowercase=lowercase,
                  docs_per_shard=docs_per_shard)
    units = []
    for source in expand_inputs(inputs):
        if isinstance(source, data_sources.TfdsName):
            split = source.split or "train"
            data_sources.tfds_builder(source.name, tfds_data_dir, str(source), split)  # fail now, not in a worker
            units += [dict(common, name=source.name, split=split, data_dir=tfds_data_dir, text_key=text_key,
                           count=tfds_units, index=k) for k in range(tfds_units)]
        else:
            units.append(dict(common, path=source, **({"text_key": text_key} if documents.has_records(source)
                                                      else {})))
    storage.check_writable(output)
    return [dict(unit, id=i) for i, unit in enumerate(units)]


def expand_inputs(inputs: list[str]) -> list[str | data_sources.TfdsName]:
    """FILES with each glob (local or gs://, quoted so that the shell leaves it) replaced by its sorted matches,
    each folder by the parquet files in it (a hub dataset's shards), and tfds:NAME[:SPLIT] parsed."""
    sources = []
    for text in inputs:
        if name := data_sources.tfds_name(text):
            sources.append(name)
        elif _is_glob(text):
            sources += [str(f) for f in documents.expand_patterns(text, "prepare FILES")]
        elif storage.as_path(text).is_dir():
            sources += [str(f) for f in parquet_files(text)]
        else:
            sources.append(text)
    files = [s for s in sources if isinstance(s, str)]
    if files or not sources:  # no input at all is an error too
        documents.require_files(files, "prepare FILES")
    return sources


def parquet_files(folder: str) -> list[storage.Path]:
    """The parquet files in a folder, sorted: one config of a hub dataset (FineWeb's sample/10BT, Wikipedia's
    20231101.en), never a whole repository by accident."""
    files = sorted(storage.as_path(folder).glob("*.parquet"))
    if not files:
        raise PrepareError(f"{folder}: a folder without *.parquet files; give the folder of one config of a hub "
                           "dataset, or text, JSON lines or parquet files (or globs)")
    return files


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")
