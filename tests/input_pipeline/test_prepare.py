"""prepare: shards that the pipeline reads like the text itself, counted skips of bad input, resume, TFDS errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.input_pipeline import documents, prepare
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.pipeline import PretrainingPipeline

VOCAB = str(REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt")
CORPUS = sorted((REPO_ROOT / "data" / "corpus").glob("*.txt"))


def units(inputs, output, docs_per_shard=50_000):
    return prepare.work_units([str(i) for i in inputs], output, VOCAB, "wordpiece", True, docs_per_shard, None)


@pytest.fixture()
def messy_inputs(tmp_path):
    """Good documents plus each kind of bad input the issue lists."""
    good = tmp_path / "good.txt"
    good.write_text("First sentence here.\nSecond one follows.\n\nOnly one sentence.\n\n"
                    "Another document starts.\n" + "word " * 400 + "\nAnd ends.\n", encoding="utf-8")
    bad_utf8 = tmp_path / "bad_utf8.txt"
    bad_utf8.write_bytes(b"A fine line.\n\xff\xfe broken bytes\nAnother fine line.\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    return [good, bad_utf8, empty]


def test_bad_input_is_counted(messy_inputs, tmp_path):
    totals = prepare.prepare(units(messy_inputs, tmp_path / "out"), num_workers=1)
    assert totals["documents"] == 3 and totals["shards"] == 2
    assert totals["empty_files"] == 1 and totals["invalid_utf8_lines"] == 1 and totals["one_sentence_documents"] == 1
    docs = list(documents.read_shards(sorted((tmp_path / "out").glob("*.tfrecord"))))
    assert [len(lengths) for _, lengths in docs] == [2, 3, 2]
    assert docs[1][1][1] == 400  # the long line is kept whole here; the pipeline cuts it to the sequence length


def test_shards_match_in_memory_tokenization_and_resume(tmp_path):
    out = tmp_path / "out"
    job = units(CORPUS[:2], out, docs_per_shard=20)
    totals = prepare.prepare(job, num_workers=1)
    assert totals["shards"] == len(list(out.glob("*.tfrecord"))) > 2
    config = config_lib.load_preset("bert", "tiny")
    config.data.input_files = ",".join(str(c) for c in CORPUS[:2])
    from_text = PretrainingPipeline(config)
    config.data.prepared_dir, config.data.input_files = str(out), ""
    from_shards = PretrainingPipeline(config)
    np.testing.assert_array_equal(from_text.examples._tokens.numpy(), from_shards.examples._tokens.numpy())
    # A finished job is not redone; an interrupted unit (no marker, a killed writer's temporary file) is redone
    # from scratch.
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("00000-*.tfrecord")}
    (out / "00001.done.json").unlink()
    (out / ".00001-0007.tfrecord.tmp-12345").write_bytes(b"half written")
    assert prepare.prepare(job, num_workers=1) == totals
    assert {p: p.stat().st_mtime_ns for p in out.glob("00000-*.tfrecord")} == mtimes
    assert not list(out.glob(".*.tmp-*"))


def test_cli_in_parallel_with_summary(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-m", "bert_jax.input_pipeline.prepare", f"--tokenizer={VOCAB}",
                             f"--output={out}", "--num_workers=2", *map(str, CORPUS[:2])],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary-000.json").read_text())
    assert summary["documents"] == 74 and summary["shards"] == 2 and summary["tokens"] > 200_000
    assert "summary: documents=74" in result.stdout and "prepare: 100%" in result.stderr


def test_missing_inputs_and_unavailable_tfds(tmp_path):
    with pytest.raises(documents.InputFilesError, match="prepare FILES: input files not found: .*nope.txt"):
        units([tmp_path / "nope.txt"], tmp_path)
    with pytest.raises(prepare.PrepareError, match="--tfds=wikipedia/20230601.en: not available offline"):
        prepare.tfds_builder("wikipedia/20230601.en", str(tmp_path))
    with pytest.raises(prepare.PrepareError, match="--tfds=no_such_corpus: no such TFDS dataset"):
        prepare.tfds_builder("no_such_corpus", str(tmp_path))


def test_documents_without_blank_lines_are_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_DOCUMENT_LINES", 3)
    path = tmp_path / "one_block.txt"
    path.write_text("".join(f"Sentence number {i}.\n" for i in range(7)))
    counts = documents.new_counts()
    assert [len(d) for d in documents.read_documents(path, counts)] == [3, 3, 1]
    assert counts["long_documents_split"] == 2
