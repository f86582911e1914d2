"""Tokenize a corpus once into sharded TFRecord documents, streaming, in parallel, resumable.

    python -m bert_jax.input_pipeline.prepare --tokenizer=data/bert-base-uncased/vocab.txt --output=DIR FILES...
    python -m bert_jax.input_pipeline.prepare --tokenizer=PATH --output=DIR --tfds=wikipedia/20230601.en

Inputs, tokenizer and DIR may be local paths or bucket URLs (gs://...). Work is split into units (one per input
file, or `--tfds_units` even slices of a TFDS split); worker processes take units, and unit k writes shards
`k-PART.tfrecord` of at most --docs_per_shard documents, then a marker `k.done.json` holding its counts and what
it was made from (the input file's size and modification time, the flags that change the shards). A rerun skips
units whose marker matches and redoes the others from scratch: an interrupted run resumes, an input file changed
since is prepared again, and no half-written shard is left behind (each file is written beside its name and renamed
when whole; a unit's marker is removed before its old shards are).
Several machines can share the work with --process_index/--process_count. Memory per worker stays bounded whatever
the input (see `documents`: long lines are cut, tokenization goes in batches). Skipped or cut input is counted in
the summary. The pipeline then reads DIR via `config.data.prepared_dir=DIR`.
"""
from __future__ import annotations

import collections
import io
import itertools
import json
import multiprocessing
import os
import sys

import tqdm
from absl import flags

from bert_jax import cli, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import documents, tokenizers

FLAGS = flags.FLAGS


class PrepareError(UserError, ValueError):
    """Input that cannot be prepared; the message names it and what to do."""


def tfds_builder(name: str, data_dir: str | None):
    """The builder of a TFDS dataset that is already prepared on this machine (nothing is downloaded)."""
    import tensorflow_datasets as tfds  # imported here: slow, and only TFDS inputs need it
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise PrepareError(f"--tfds={name}: no such TFDS dataset") from e
    if not builder.is_prepared():
        raise PrepareError(f"--tfds={name}: not available offline in {builder.data_dir}; build it where there is "
                           f"network access (`tfds build {name}`) and pass its folder as --tfds_data_dir")
    return builder


def read_tfds_documents(unit: dict, counts: collections.Counter):
    """Documents of one even slice of a TFDS split: each example's text, one sentence per non-empty line, read
    like a text file's lines (long ones cut, invalid UTF-8 skipped)."""
    import tensorflow_datasets as tfds
    builder = tfds_builder(unit["name"], unit["data_dir"])
    split = tfds.even_splits(unit["split"], unit["count"])[unit["index"]]
    for i, example in enumerate(builder.as_dataset(split=split).as_numpy_iterator()):
        lines = documents.read_lines(io.BytesIO(example[unit["text_key"]]), f"{unit['name']}[{i}]", counts)
        yield from documents.group_documents(filter(None, lines), counts)


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
    from the same input and settings)."""
    output, prefix = storage.as_path(unit["output"]), f"{unit['id']:05d}"
    marker, source = output / f"{prefix}.done.json", made_from(unit)
    if marker.exists():
        done = json.loads(marker.read_text())
        if done.get("made_from") == source:
            return done
        marker.unlink()  # first: its old shards must never count as done with new ones
    for stale in unit_files(output, prefix):
        stale.unlink()
    tokenizer = tokenizers.load_tokenizer(unit["tokenizer_kind"], unit["tokenizer"], unit["lowercase"])
    counts = documents.new_counts()
    docs = (documents.tokenize_files([unit["path"]], tokenizer, counts) if unit.get("path")
            else documents.tokenize_documents(read_tfds_documents(unit, counts), tokenizer, counts))
    records = (documents.serialize(*doc) for doc in docs)
    shards = 0
    for first in records:  # each shard takes its first record and up to docs_per_shard - 1 more from the stream
        storage.write_records(output / f"{prefix}-{shards:04d}.tfrecord",
                              itertools.chain([first], itertools.islice(records, unit["docs_per_shard"] - 1)))
        shards += 1
    result = dict(counts, shards=shards, source=str(unit.get("path") or unit.get("name")), made_from=source)
    storage.atomic_write(marker, json.dumps(result))
    return result


def work_units(inputs: list[str], output: storage.PathLike, tokenizer: str, tokenizer_kind: str, lowercase: bool,
               docs_per_shard: int, tfds: dict | None) -> list[dict]:
    """All units of the job, numbered the same on every machine; creates the output folder and checks that it can
    be written (a missing bucket or permission fails here, once, not in every worker)."""
    common = dict(output=str(output), tokenizer=tokenizer, tokenizer_kind=tokenizer_kind, lowercase=lowercase,
                  docs_per_shard=docs_per_shard)
    if tfds:
        tfds_builder(tfds["name"], tfds["data_dir"])  # fail now, not in a worker
        units = [dict(common, id=i, index=i, **tfds) for i in range(tfds["count"])]
    else:
        documents.require_files(inputs, "prepare FILES")
        units = [dict(common, id=i, path=str(f)) for i, f in enumerate(inputs)]
    storage.check_writable(output)
    return units


def prepare(units: list[dict], num_workers: int, process_index: int = 0, process_count: int = 1) -> dict:
    """Run this machine's share of the units; returns the summed counts of all of them."""
    mine = units[process_index::process_count]
    totals = collections.Counter()
    progress = tqdm.tqdm(total=len(mine), unit="unit", desc="prepare", file=sys.stderr)
    if num_workers > 1 and len(mine) > 1:
        # spawn: TensorFlow and the Rust tokenizers are not fork-safe once initialised.
        with multiprocessing.get_context("spawn").Pool(min(num_workers, len(mine))) as pool:
            results = pool.imap_unordered(prepare_unit, mine)
            for result in results:
                _add(totals, result, progress)
    else:
        for unit in mine:
            _add(totals, prepare_unit(unit), progress)
    progress.close()
    return dict(totals)


def _add(totals, result, progress):
    totals.update({k: v for k, v in result.items() if isinstance(v, int)})
    progress.update(1)
    progress.set_postfix(documents=totals["documents"], tokens=totals["tokens"])


def main(argv):
    prepare_from_flags(argv[1:])


def prepare_from_flags(inputs: list[str]) -> None:
    """The command: check the tokenizer and output, prepare this machine's units, write its summary."""
    kind = FLAGS.tokenizer_kind or tokenizers.infer_kind(FLAGS.tokenizer)
    tokenizers.load_tokenizer(kind, FLAGS.tokenizer, FLAGS.lowercase)  # a bad vocabulary fails before any work
    tokenizer = storage.as_path(FLAGS.tokenizer)
    tokenizer = tokenizer if storage.is_remote(tokenizer) else tokenizer.resolve()  # units carry it absolute
    output = storage.as_path(FLAGS.output)
    tfds = FLAGS.tfds and dict(name=FLAGS.tfds, split=FLAGS.tfds_split, data_dir=FLAGS.tfds_data_dir,
                               text_key=FLAGS.tfds_text_key, count=FLAGS.tfds_units)
    units = work_units(inputs, output, str(tokenizer), kind, FLAGS.lowercase, FLAGS.docs_per_shard, tfds or None)
    totals = prepare(units, FLAGS.num_workers, FLAGS.process_index, FLAGS.process_count)
    if FLAGS.process_count == 1:
        sources = documents.plural(len(units), "TFDS slice" if tfds else "file")
        documents.check_enough_documents(collections.Counter(totals), 1, sources, "prepare")
    storage.atomic_write(output / f"summary-{FLAGS.process_index:03d}.json", json.dumps(totals, indent=1))
    print("summary: " + ", ".join(f"{k}={v}" for k, v in totals.items()))


def define_flags():
    """Command-line flags, defined only when run as a program so that importing this module is free."""
    flags.DEFINE_string("tokenizer", None, "A vocab.txt (wordpiece), a .model (sentencepiece) or a bpe folder.")
    flags.DEFINE_enum("tokenizer_kind", None, tokenizers.KINDS, "Tokenizer kind; by default from the path's name.")
    flags.DEFINE_bool("lowercase", True, "Wordpiece only: lowercase text (uncased vocabularies).")
    flags.DEFINE_string("output", None, "Folder for the shards, local or gs:// (created; a rerun resumes in it).")
    flags.DEFINE_integer("num_workers", max(1, (os.cpu_count() or 1)), "Worker processes on this machine.")
    flags.DEFINE_integer("docs_per_shard", 50_000, "Documents per output shard.")
    flags.DEFINE_integer("process_index", 0, "This machine's index when several share the work.")
    flags.DEFINE_integer("process_count", 1, "How many machines share the work.")
    flags.DEFINE_string("tfds", None, "A TFDS dataset name to read instead of text files (must be prepared locally).")
    flags.DEFINE_string("tfds_split", "train", "TFDS split.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir holding the prepared dataset.")
    flags.DEFINE_string("tfds_text_key", "text", "TFDS feature with the text; its lines are the sentences.")
    flags.DEFINE_integer("tfds_units", 64, "How many even slices of the TFDS split to process as separate units.")
    flags.mark_flags_as_required(["tokenizer", "output"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
