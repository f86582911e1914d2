"""Tokenize a corpus once into sharded TFRecord documents, streaming, in parallel, resumable.

    python -m bert_jax.input_pipeline.prepare --tokenizer=data/bert-base-uncased/vocab.txt --output=DIR FILES...
    python -m bert_jax.input_pipeline.prepare --tokenizer=PATH --output=DIR --tfds=wikipedia/20230601.en
    python -m bert_jax.input_pipeline.prepare --runner=DataflowRunner --tokenizer=gs://... --output=gs://... \
        'gs://BUCKET/c4/*.json.gz' -- --project=P --region=R --temp_location=gs://... --setup_file=./setup.py

FILES are text files or globs (`*.jsonl`/`*.json` are JSON lines with their text under --text_key; any may end in
.gz or .bz2); inputs, tokenizer and DIR may be local paths or bucket URLs (gs://...). Work is split into units (one
per input file, or `--tfds_units` even slices of a TFDS split), numbered in input order, and unit k writes shards
`k-PART.tfrecord` of at most --docs_per_shard documents, then a marker `k.done.json` holding its counts and what
it was made from (the input file's size and modification time, the flags that change the shards). A rerun skips
units whose marker matches and redoes the others from scratch: an interrupted run resumes, an input file changed
since is prepared again, and no half-written shard is left behind (each file is written beside its name and renamed
when whole; a unit's marker is removed before its old shards are). So the shards are a pure function of the inputs
and flags, whichever driver ran the units: worker processes on this machine (--runner=local, the default) or an
Apache Beam runner for many machines (`beam_prepare`; Beam's own options follow `--`). Memory per worker stays
bounded whatever the input (see `documents`: long lines are cut, tokenization goes in batches). Skipped or cut input
is counted, and its first places named, in DIR/summary.json. The pipeline then reads DIR via
`config.data.prepared_dir=DIR`.
"""
from __future__ import annotations

import collections
import itertools
import json
import multiprocessing
import os
import sys

import tqdm
from absl import flags, logging

from bert_jax import cli, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import documents, tokenizers

FLAGS = flags.FLAGS
SUMMARY = "summary.json"


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


def read_tfds_documents(unit: dict, counts: documents.Counts):
    """Documents of one even slice of a TFDS split: each example's text, one sentence per non-empty line, read
    like a JSON line's text (`documents.text_documents`)."""
    import tensorflow_datasets as tfds
    builder = tfds_builder(unit["name"], unit["data_dir"])
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
    try:
        shards = write_shards(output, prefix, documents.tokenize_documents(unit_documents(unit, counts), tokenizer,
                                                                           counts), unit["docs_per_shard"])
    except documents.UnreadableFileError as e:  # counted and named; no marker, so that a rerun tries it again
        logging.warning("%s; skipped (counted)", e)
        for partial in unit_files(output, prefix):
            partial.unlink()
        counts = documents.new_counts()
        counts.note("unreadable_files", str(e))
        return unit_result(unit, counts, 0, source)
    result = unit_result(unit, counts, shards, source)
    storage.atomic_write(marker, json.dumps(result))
    return result


def write_shards(output: storage.Path, prefix: str, docs, docs_per_shard: int) -> int:
    """Write tokenized documents into shards `prefix-PART.tfrecord`, each written whole then renamed; returns
    how many."""
    records = (documents.serialize(*doc) for doc in docs)
    shards = 0
    for first in records:  # each shard takes its first record and up to docs_per_shard - 1 more from the stream
        storage.write_records(output / f"{prefix}-{shards:04d}.tfrecord",
                              itertools.chain([first], itertools.islice(records, docs_per_shard - 1)))
        shards += 1
    return shards


def unit_result(unit: dict, counts: documents.Counts, shards: int, source: dict) -> dict:
    """A unit's counts and where its skips happened (file:line where known, else the unit's input)."""
    name = unit_name(unit)
    where = {k: counts.where.get(k) or [name] for k in documents.SKIP_COUNTS if counts[k]}
    return dict(counts, shards=shards, where=where, source=name, made_from=source)


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
               docs_per_shard: int, tfds: dict | None, text_key: str = "text") -> list[dict]:
    """All units of the job, numbered in input order (a glob's matches sorted); creates the output folder and
    checks that it can be written (a missing bucket or permission fails here, once, not in every worker)."""
    common = dict(output=str(output), tokenizer=tokenizer, tokenizer_kind=tokenizer_kind, lowercase=lowercase,
                  docs_per_shard=docs_per_shard)
    if tfds:
        tfds_builder(tfds["name"], tfds["data_dir"])  # fail now, not in a worker
        units = [dict(common, id=i, index=i, **tfds) for i in range(tfds["count"])]
    else:
        files = expand_inputs(inputs)
        units = [dict(common, id=i, path=str(f), **({"text_key": text_key} if documents.is_json_lines(f) else {}))
                 for i, f in enumerate(files)]
    storage.check_writable(output)
    return units


def expand_inputs(inputs: list[str]) -> list[str]:
    """FILES with each glob (local or gs://, quoted so that the shell leaves it) replaced by its sorted matches."""
    files = [f for i in inputs for f in (documents.expand_patterns(i, "prepare FILES") if _is_glob(i) else [i])]
    documents.require_files(files, "prepare FILES")
    return [str(f) for f in files]


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def prepare(units: list[dict], num_workers: int) -> dict:
    """Run the units in worker processes on this machine (the local driver); returns the job's summary."""
    results, totals = [], collections.Counter()
    progress = tqdm.tqdm(total=len(units), unit="unit", desc="prepare", file=sys.stderr)
    if num_workers > 1 and len(units) > 1:
        # spawn: TensorFlow and the Rust tokenizers are not fork-safe once initialised.
        with multiprocessing.get_context("spawn").Pool(min(num_workers, len(units))) as pool:
            for result in pool.imap_unordered(prepare_one, units):
                _add(results, totals, result, progress)
    else:
        for unit in units:
            _add(results, totals, prepare_one(unit), progress)
    progress.close()
    return summarize(results)


def _add(results, totals, result, progress):
    results.append(result)
    totals.update(documents=result[1]["documents"], tokens=result[1]["tokens"])
    progress.update(1)
    progress.set_postfix(documents=totals["documents"], tokens=totals["tokens"])


def main(argv):
    beam_options = [a for a in argv[1:] if a.startswith("--")]  # absl leaves only what follows `--` as flags
    prepare_from_flags([a for a in argv[1:] if not a.startswith("--")], beam_options)


def prepare_from_flags(inputs: list[str], beam_options: list[str]) -> None:
    """The command: check the tokenizer and output, run the units on the chosen driver, print the summary."""
    if beam_options and FLAGS.runner == "local":
        raise PrepareError(f"{beam_options[0]}: Beam options (after --) need a Beam runner, e.g. "
                           "--runner=DirectRunner; the local driver takes none")
    kind = FLAGS.tokenizer_kind or tokenizers.infer_kind(FLAGS.tokenizer)
    tokenizers.load_tokenizer(kind, FLAGS.tokenizer, FLAGS.lowercase)  # a bad vocabulary fails before any work
    tokenizer = storage.as_path(FLAGS.tokenizer)
    tokenizer = tokenizer if storage.is_remote(tokenizer) else tokenizer.resolve()  # units carry it absolute
    output = storage.as_path(FLAGS.output)
    tfds = FLAGS.tfds and dict(name=FLAGS.tfds, split=FLAGS.tfds_split, data_dir=FLAGS.tfds_data_dir,
                               text_key=FLAGS.text_key, count=FLAGS.tfds_units)
    units = work_units(inputs, output, str(tokenizer), kind, FLAGS.lowercase, FLAGS.docs_per_shard, tfds or None,
                       FLAGS.text_key)
    if FLAGS.runner == "local":
        summary = save_summary(prepare(units, FLAGS.num_workers), str(output))
    else:
        from bert_jax.input_pipeline import beam_prepare  # imported here: Beam is an optional extra
        summary = beam_prepare.run(units, FLAGS.runner, beam_options)
    print("summary: " + ", ".join(f"{k}={v}" for k, v in summary.items() if isinstance(v, int)))
    for kind, places in summary["where"].items():
        print(f"  {kind}: {', '.join(places)}")
    sources = documents.plural(len(units), "TFDS slice" if tfds else "file")
    documents.check_enough_documents(collections.Counter(summary), 1, sources, "prepare")


def define_flags():
    """Command-line flags, defined only when run as a program so that importing this module is free."""
    flags.DEFINE_string("tokenizer", None, "A vocab.txt (wordpiece), a .model (sentencepiece) or a bpe folder.")
    flags.DEFINE_enum("tokenizer_kind", None, tokenizers.KINDS, "Tokenizer kind; by default from the path's name.")
    flags.DEFINE_bool("lowercase", True, "Wordpiece only: lowercase text (uncased vocabularies).")
    flags.DEFINE_string("output", None, "Folder for the shards, local or gs:// (created; a rerun resumes in it).")
    flags.DEFINE_string("runner", "local", "local (worker processes on this machine) or a Beam runner: "
                        "DirectRunner, DataflowRunner, FlinkRunner, SparkRunner; Beam's options follow `--`.")
    flags.DEFINE_integer("num_workers", max(1, (os.cpu_count() or 1)), "Local driver: worker processes.")
    flags.DEFINE_integer("docs_per_shard", 50_000, "Documents per output shard.")
    flags.DEFINE_string("text_key", "text", "The field with the text in JSON lines and TFDS examples; its lines are "
                        "the sentences.")
    flags.DEFINE_string("tfds", None, "A TFDS dataset name to read instead of text files (must be prepared locally).")
    flags.DEFINE_string("tfds_split", "train", "TFDS split.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir holding the prepared dataset.")
    flags.DEFINE_integer("tfds_units", 64, "How many even slices of the TFDS split to process as separate units.")
    flags.mark_flags_as_required(["tokenizer", "output"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
