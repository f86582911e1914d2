"""Tokenize a corpus once into sharded TFRecord documents, streaming, in parallel, resumable.

    python -m bert_jax.input_pipeline.prepare --tokenizer=data/bert-base-uncased/vocab.txt --output=DIR FILES...
    python -m bert_jax.input_pipeline.prepare --tokenizer=PATH --output=DIR tfds:wikipedia/20230601.en
    python -m bert_jax.input_pipeline.prepare --runner=DataflowRunner --tokenizer=gs://... --output=gs://... \
        'gs://BUCKET/c4/*.json.gz' -- --project=P --region=R --temp_location=gs://... --setup_file=./setup.py

FILES name the corpus in any form of bert_jax.data_sources: text files, JSON lines (`*.jsonl`, `*.json`) and
parquet files (a hub dataset's shards: FineWeb, Wikipedia), the last two with their text under --text_key; globs;
folders (the parquet files below them); tfds:NAME[:SPLIT] (a built TFDS dataset in --tfds_data_dir, the train split
by default). Any file may end in .gz or .bz2; inputs, tokenizer and DIR may be local paths or bucket URLs (gs://...).
The work is split into units (`prepare_units`: one per file, `--tfds_units` slices per TFDS split), each writing
its own shards and marker, so a rerun resumes and the shards are a pure function of the inputs and flags, whichever
driver ran the units: worker processes on this machine (--runner=local, the default, below) or an Apache Beam
runner for many machines (`beam_prepare`; Beam's own options follow `--`). Memory per worker stays bounded whatever
the input (see `documents`). Skipped or cut input is counted, and its first places named, in DIR/summary.json. The
pipeline then reads DIR via `config.data.prepared_dir=DIR`.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import sys

import tqdm
from absl import flags

from bert_jax import cli, storage
from bert_jax.input_pipeline import documents, tokenizers
from bert_jax.input_pipeline.prepare_units import PrepareError, prepare_one, save_summary, summarize, work_units

FLAGS = flags.FLAGS


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
    units = work_units(inputs, output, str(tokenizer), kind, FLAGS.lowercase, FLAGS.docs_per_shard, FLAGS.text_key,
                       FLAGS.tfds_data_dir, FLAGS.tfds_units)
    if FLAGS.runner == "local":
        summary = save_summary(prepare(units, FLAGS.num_workers), str(output))
    else:
        from bert_jax.input_pipeline import beam_prepare  # imported here: Beam is an optional extra
        summary = beam_prepare.run(units, FLAGS.runner, beam_options)
    print("summary: " + ", ".join(f"{k}={v}" for k, v in summary.items() if isinstance(v, int)))
    for kind, places in summary["where"].items():
        print(f"  {kind}: {', '.join(places)}")
    documents.check_enough_documents(collections.Counter(summary), 1, sources_of(units), "prepare")


def sources_of(units: list[dict]) -> str:
    """What the units read, for the summary's error line: "3 files", "64 TFDS slices", or both."""
    files = sum(1 for unit in units if unit.get("path"))
    slices = len(units) - files
    return " and ".join([documents.plural(files, "file")] * bool(files)
                        + [documents.plural(slices, "TFDS slice")] * bool(slices))


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
    flags.DEFINE_string("text_key", "text", "The field (column) with the text in JSON lines, parquet and TFDS "
                        "examples; its lines are the sentences.")
    flags.DEFINE_string("tfds_data_dir", None, "Where tfds:NAME inputs are built (TFDS's default folder if unset).")
    flags.DEFINE_integer("tfds_units", 64, "How many even slices of each TFDS split to process as separate units.")
    flags.mark_flags_as_required(["tokenizer", "output"])


if __name__ == "__main__":
    define_flags()
    cli.run(main)
