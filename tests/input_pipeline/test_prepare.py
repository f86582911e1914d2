"""prepare: shards that the pipeline reads like the text itself, counted skips of bad input, resume, TFDS errors,
compressed and JSON-lines inputs."""
import bz2
import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib, storage
from bert_jax.data_sources import DataSourceError
from bert_jax.storage import StorageError
from bert_jax.input_pipeline import documents, prepare
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.pipeline import PretrainingPipeline

VOCAB = str(REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt")
CORPUS = sorted((REPO_ROOT / "data" / "corpus").glob("*.txt"))


def units(inputs, output, docs_per_shard=50_000):
    return prepare.work_units([str(i) for i in inputs], output, VOCAB, "wordpiece", True, docs_per_shard)


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


def first_documents(path, size: int) -> str:
    """The documents of a bundled book in its first `size` characters or so (cut at a blank line)."""
    return path.read_text(encoding="utf-8")[:size].rsplit("\n\n", 1)[0] + "\n"


def mixed_inputs(folder):
    """Every input format (text, .gz, .bz2, JSON lines) and every kind of bad input but an over-long JSON record
    (tested below), as globs a user would give; test_beam runs them on the Beam runners."""
    folder.mkdir(exist_ok=True)
    (folder / "brown.txt").write_text(first_documents(CORPUS[0], 40_000), encoding="utf-8")
    (folder / "persuasion.txt.gz").write_bytes(gzip.compress(first_documents(CORPUS[1], 40_000).encode()))
    (folder / "sense.txt.bz2").write_bytes(bz2.compress(first_documents(CORPUS[2], 40_000).encode()))
    texts = first_documents(CORPUS[0], 90_000)[40_000:].split("\n\n")
    records = [{"text": text, "url": f"u{i}"} for i, text in enumerate(texts) if text.strip()]
    lines = [json.dumps(r) for r in records] + ['{"url": "no text"}', "not json", '{"text": ""}',
                                                '{"text": "One sentence alone."}']
    (folder / "pages.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "messy.txt").write_bytes(b"A fine line.\n\xff\xfe broken bytes\nAnother fine line.\n\n"
                                       + b"word " * 20_000 + b"\nAnd ends.\n")
    (folder / "empty.txt").write_text("\n\n")
    (folder / "broken.txt.gz").write_bytes(b"this is not gzip data")
    return [str(folder / "*.txt*"), str(folder / "pages.jsonl")]


def test_formats_and_bad_input_are_counted_and_named(tmp_path):
    inputs = mixed_inputs(tmp_path / "in")
    job = prepare.work_units(inputs, tmp_path / "out", VOCAB, "wordpiece", True, 1)
    assert [os.path.basename(u["path"]) for u in job] == [
        "broken.txt.gz", "brown.txt", "empty.txt", "messy.txt", "persuasion.txt.gz", "sense.txt.bz2", "pages.jsonl"]
    summary = prepare.prepare(job, num_workers=1)
    skipped = {k: v for k, v in summary.items() if k in documents.SKIP_COUNTS and v}
    assert skipped == dict(unreadable_files=1, empty_files=1, invalid_utf8_lines=1, long_lines_split=1,
                           invalid_records=2, empty_records=1, one_sentence_documents=1)
    assert summary["documents"] == summary["shards"] == 12
    folder = tmp_path / "in"
    assert summary["where"]["unreadable_files"][0].startswith(f"{folder}/broken.txt.gz: cannot read it")
    assert summary["where"]["invalid_utf8_lines"] == [f"{folder}/messy.txt:2"]
    assert summary["where"]["long_lines_split"] == [f"{folder}/messy.txt:5"]
    records = len((folder / "pages.jsonl").read_text().splitlines()) - 4
    assert summary["where"]["invalid_records"] == [f"{folder}/pages.jsonl:{records + n}" for n in (1, 2)]
    assert summary["where"]["empty_records"] == [f"{folder}/pages.jsonl:{records + 3}"]
    assert summary["where"]["one_sentence_documents"] == [f"{folder}/pages.jsonl"]
    assert not list((tmp_path / "out").glob("00000*"))  # the unreadable file: no shards, no marker
    # Compressed and JSON-lines inputs give the documents of the same text in a plain file.
    (tmp_path / "plain").mkdir()
    for name, book, size in [("persuasion.txt", CORPUS[1], 40_000), ("sense.txt", CORPUS[2], 40_000)]:
        (tmp_path / "plain" / name).write_text(first_documents(book, size), encoding="utf-8")
    records = [json.loads(line) for line in (folder / "pages.jsonl").read_text().splitlines()[:-4]]
    (tmp_path / "plain" / "pages.txt").write_text("\n\n".join(r["text"] for r in records), encoding="utf-8")
    plain = prepare.work_units([str(tmp_path / "plain" / n) for n in ("persuasion.txt", "sense.txt", "pages.txt")],
                               tmp_path / "plain_out", VOCAB, "wordpiece", True, 1)
    prepare.prepare(plain, num_workers=1)
    for unit, plain_unit in [("00004", "00000"), ("00005", "00001"), ("00006", "00002")]:
        assert shard_documents(tmp_path / "out", unit) == shard_documents(tmp_path / "plain_out", plain_unit) != []


def test_an_over_long_json_record_is_skipped_and_the_next_one_read(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_RECORD_BYTES", 64)
    path = tmp_path / "pages.jsonl"
    path.write_text(json.dumps({"text": "word " * 100}) + "\n" + json.dumps({"text": "First one.\nSecond one."}) + "\n")
    counts = documents.new_counts()
    assert list(documents.read_documents(path, counts)) == [["First one.", "Second one."]]
    assert counts["long_records_skipped"] == 1 and counts.where["long_records_skipped"] == [f"{path}:1"]


def shard_documents(folder, unit):
    return [(t.tolist(), s.tolist()) for t, s in documents.read_shards(sorted(folder.glob(f"{unit}-*.tfrecord")))]


def test_a_beam_runner_without_beam_is_one_line(tmp_path, monkeypatch):
    from bert_jax.input_pipeline import beam_prepare
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # as where the extra is not installed
    with pytest.raises(prepare.PrepareError, match=r"--runner=DirectRunner needs Apache Beam: pip install"):
        beam_prepare.run(units(CORPUS[:1], tmp_path), "DirectRunner", [])


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
    # A shard damaged since (truncated, or one byte changed in place) no longer matches its marker: its unit is
    # prepared again, to the same bytes; the pipeline's error for the damaged shard says to do so.
    shards = {p: p.read_bytes() for p in out.glob("*.tfrecord")}
    truncated, flipped = out / "00000-0001.tfrecord", out / "00001-0000.tfrecord"
    truncated.write_bytes(shards[truncated][:100])
    flipped.write_bytes(shards[flipped][:50] + bytes([shards[flipped][50] ^ 1]) + shards[flipped][51:])
    with pytest.raises(StorageError, match=re.escape(f"{truncated}: corrupt or truncated TFRecord file; run the "
                                                     "prepare command that wrote it again")):
        list(storage.read_records(truncated))
    assert prepare.prepare(job, num_workers=1) == totals
    assert {p: p.read_bytes() for p in out.glob("*.tfrecord")} == shards


def test_cli_in_parallel_with_summary(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-m", "bert_jax.input_pipeline.prepare", f"--tokenizer={VOCAB}",
                             f"--output={out}", "--num_workers=2", *map(str, CORPUS[:2])],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents"] == 74 and summary["shards"] == 2 and summary["tokens"] > 200_000
    assert "summary: documents=74" in result.stdout and "prepare: 100%" in result.stderr


def test_missing_inputs_and_unavailable_tfds(tmp_path):
    with pytest.raises(documents.InputFilesError, match="prepare FILES: input files not found: .*nope.txt"):
        units([tmp_path / "nope.txt"], tmp_path)
    tfds_units = lambda name: prepare.work_units([name], tmp_path, VOCAB, "wordpiece", True, 1,
                                                 tfds_data_dir=str(tmp_path))
    with pytest.raises(DataSourceError, match=re.escape(
            f"tfds:wikipedia/20230601.en: TFDS wikipedia/20230601.en is not built in {tmp_path}; fetch it where "
            f"there is network: pip install -e '.[data]' && tfds build wikipedia/20230601.en --data_dir={tmp_path}")):
        tfds_units("tfds:wikipedia/20230601.en")
    with pytest.raises(DataSourceError, match="tfds:no_such_corpus: no TFDS dataset no_such_corpus"):
        tfds_units("tfds:no_such_corpus")


def test_documents_without_blank_lines_are_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_DOCUMENT_LINES", 3)
    path = tmp_path / "one_block.txt"
    path.write_text("".join(f"Sentence number {i}.\n" for i in range(7)))
    counts = documents.new_counts()
    assert [len(d) for d in documents.read_documents(path, counts)] == [3, 3, 1]
    assert counts["long_documents_split"] == 2


@pytest.mark.parametrize("tokens,lengths", [
    ([], []),  # an empty list is no field at all
    ([0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 30521, 2**31 - 1], [4, 6]),  # each varint's size boundary
    ([-1, -2**63, 2**63 - 1, 2**56, 2**63 - 2**56], [1]),  # ten-byte varints, negatives as two's complement
    (np.random.default_rng(0).integers(0, 30522, 5000), np.random.default_rng(1).integers(1, 60, 120)),
])
def test_documents_serialize_as_tensorflow_does(tokens, lengths):
    import tensorflow as tf

    feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
               for key, values in (("token_ids", tokens), ("sentence_lengths", lengths))}
    expected = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)
    assert documents.serialize(np.asarray(tokens, np.int64), np.asarray(lengths, np.int64)) == expected


def test_preparing_imports_no_tensorflow(tmp_path):
    """TensorFlow costs a worker process 0.7 GB and seconds of CPU to import: prepare writes its shards without it."""
    script = ("import sys; from bert_jax.input_pipeline import prepare; "
              f"prepare.prepare(prepare.work_units([{str(CORPUS[0])!r}], {str(tmp_path)!r}, {VOCAB!r}, 'wordpiece', "
              "True, 50_000), num_workers=1); print(sorted(m for m in sys.modules if m.startswith('tensorflow')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "[]", result.stderr[-2000:]
    assert list(tmp_path.glob("*.tfrecord"))
