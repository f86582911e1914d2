"""prepare on Apache Beam: the DirectRunner, in this process and on two worker processes, writes the local driver's
shards and markers byte for byte and its summary (counts and named bad input), and a unit's leftovers from a failed
attempt are replaced; a run leaves no temporary folder behind. Skipped where the `beam` extra is not installed (the
test extra includes it, so CI runs it; docs/data.md)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("apache_beam")

from bert_jax.input_pipeline import beam_prepare, prepare, prepare_units  # noqa: E402
from bert_jax.input_pipeline.config import REPO_ROOT  # noqa: E402
from test_prepare import VOCAB, mixed_inputs  # noqa: E402


def job(inputs, out):
    return prepare.work_units(inputs, out, VOCAB, "wordpiece", True, 1)


def written(folder):
    """What prepare wrote that later steps read: the shards and the units' markers."""
    return {p.name: p.read_bytes() for p in sorted([*folder.glob("*.tfrecord"), *folder.glob("*.done.json")])}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The mixed inputs prepared by the local driver."""
    folder = tmp_path_factory.mktemp("beam")
    inputs = mixed_inputs(folder / "in")
    summary = prepare.prepare(job(inputs, folder / "local"), num_workers=1)
    return inputs, folder, json.loads(json.dumps(summary))


def test_direct_runner_in_process_writes_what_the_local_driver_writes(local):
    inputs, folder, summary = local
    out = folder / "in_memory"
    assert beam_prepare.run(job(inputs, out), "DirectRunner", ["--direct_running_mode=in_memory"]) == summary
    assert written(out) == written(folder / "local") and len(written(out)) > 12
    assert json.loads((out / prepare_units.SUMMARY).read_text()) == summary
    assert summary["documents"] == 12 and summary["invalid_utf8_lines"] == summary["unreadable_files"] == 1
    assert summary["where"]["invalid_utf8_lines"] == [f"{folder}/in/messy.txt:2"]


def test_cli_on_two_worker_processes_writes_what_the_local_driver_writes(local, tmp_path):
    inputs, folder, summary = local
    out = folder / "two_workers"
    temp = tmp_path / "temp"  # Beam's job server and job submission each made a folder here and left it
    temp.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(temp))
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.input_pipeline.prepare", "--runner=DirectRunner", f"--tokenizer={VOCAB}",
         f"--output={out}", "--docs_per_shard=1", *inputs,
         "--", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert written(out) == written(folder / "local")
    assert json.loads((out / prepare_units.SUMMARY).read_text()) == summary
    assert f"summary: documents={summary['documents']}," in result.stdout
    assert f"  invalid_utf8_lines: {folder}/in/messy.txt:2" in result.stdout.splitlines()
    assert not list(temp.iterdir())


def test_a_retried_unit_replaces_what_a_failed_attempt_left(local):
    inputs, folder, summary = local
    out = folder / "retried"
    out.mkdir()
    (out / "00001-0000.tfrecord").write_bytes(b"a shard cut short by a killed worker")
    (out / ".00001-0001.tfrecord.tmp-4242").write_bytes(b"half written")
    assert beam_prepare.run(job(inputs, out), "DirectRunner", []) == summary
    assert written(out) == written(folder / "local")
    assert not list(out.glob(".*.tmp-*"))
