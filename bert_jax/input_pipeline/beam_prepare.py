"""`prepare` on Apache Beam, for corpora that outgrow one machine (`pip install 'bert_jax[beam]'`).

    python -m bert_jax.input_pipeline.prepare --runner=DataflowRunner --tokenizer=gs://B/vocab.txt \
        --output=gs://B/prepared/c4 'gs://B/c4/*.json.gz' -- --project=P --region=R --temp_location=gs://B/tmp \
        --setup_file=./setup.py --max_num_workers=100

Only the driver differs from the local one: the same units (`prepare_units.work_units`), each one Beam element run
by `prepare_units.prepare_unit`, spread over the workers by a Reshuffle; their results are summed in unit order into
DIR/summary.json by `prepare_units.summarize`. A unit's shards are written under temporary names and renamed, its marker
last, and running a unit again (Beam retrying a failed bundle) writes the same bytes: shard names and contents
depend only on the inputs and flags, never on the runner, its parallelism or which worker ran what.
"""
from __future__ import annotations

import json

from bert_jax import storage
from bert_jax.input_pipeline import prepare_units


def run(units: list[dict], runner: str, beam_options: list[str]) -> dict:
    """Run the units on a Beam runner (waiting for it to finish); returns the summary it wrote."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError as e:
        raise prepare_units.PrepareError(f"--runner={runner} needs Apache Beam: pip install -e '.[beam]' "
                                         "(docs/data.md), or use --runner=local") from e
    output = units[0]["output"]
    # Beam makes a temporary folder for each job's submission and one for its local job server, and leaves both.
    with (storage.temporary_files_kept_inside("bert_jax-beam-"),
          beam.Pipeline(options=PipelineOptions(beam_options, runner=runner)) as pipeline):
        _ = (pipeline
             | "Units" >> beam.Create(units)
             | "Spread" >> beam.Reshuffle()  # else a runner may fuse every unit onto the worker that made them
             | "Prepare" >> beam.Map(prepare_units.prepare_one)
             | "Gather" >> beam.combiners.ToList()
             | "Summarize" >> beam.Map(prepare_units.summarize)
             | "Save" >> beam.Map(prepare_units.save_summary, output))
    return json.loads((storage.as_path(output) / prepare_units.SUMMARY).read_text())
