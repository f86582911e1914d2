"""Contrastive fine-tuning end to end, on the SQuAD retrieval sample (data/) with a tiny random BERT over the
8-device mesh: a stopped run resumes to the same losses and scores, the workdir loads as an embedding model with
its pooling, and its sentence-transformers export encodes as bert_jax does."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import train_helpers
from embed_helpers import STSB_DEV, squad_folder, tiny_bert_dir

import bert_jax
from bert_jax import config_lib, embed_train
from bert_jax import finetune as finetune_lib
from bert_jax.sentence_embedding import Pooling
from bert_jax.tasks import pairs as pairs_lib

TEXTS = ["Which team won Super Bowl 50?", "Warsaw is the capital of Poland.", "a"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embed")
    return tiny_bert_dir(folder / "init"), squad_folder(folder / "squad")


def embed_config(init, squad, **overrides):
    config = config_lib.load_preset("embed", "tiny")
    settings = dict(init=str(init), train_files=str(squad / "pairs.jsonl"), batch_size=16, max_seq_length=64,
                    max_query_length=16, length_bucket=0, log_every_steps=1, eval_batch_size=32)
    config.update({**settings, **overrides})
    config.optimizer.learning_rate = 1e-3
    return config


def logged(workdir, key="loss"):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows if key in row]


# On one device: the subject is stopping, resuming and exporting (tests/test_contrastive.py checks the loss over a
# mesh, tests/test_train_resume.py restores onto meshes); 8 fake devices took this test 57 s instead of 41.
def test_stopped_run_resumes_exactly_and_exports_to_sentence_transformers(data, tmp_path, monkeypatch,
                                                                          one_device_mesh):
    init, squad = data
    config = embed_config(init, squad, eval_beir_dir=str(squad), eval_sts_file=str(STSB_DEV))
    straight = embed_train.train_and_evaluate(config, tmp_path / "straight")
    assert set(straight) >= {"ndcg@10", "mrr@10", "recall@100", "sts_spearman"}
    assert straight["queries"] == 90 and straight["passages"] == 32
    losses = logged(tmp_path / "straight")
    assert len(losses) == 6 and losses[-1] < losses[0]  # 90 pairs, batches of 16

    fetch_rows = finetune_lib.batch_rows
    monkeypatch.setattr(finetune_lib, "batch_rows", train_helpers.rows_signalled_at(3, fetch_rows))
    assert embed_train.train_and_evaluate(config, tmp_path / "stopped") == {}
    monkeypatch.setattr(finetune_lib, "batch_rows", fetch_rows)
    resumed = embed_train.train_and_evaluate(config, tmp_path / "stopped")
    assert logged(tmp_path / "stopped") == losses
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in straight.items()
                                                                     if k != "seconds"}

    model = bert_jax.load_pretrained(tmp_path / "straight")
    assert model.head == "backbone" and model.pooling == Pooling("mean", True, 64)
    initial = bert_jax.load_pretrained(init)
    assert not np.allclose(model.embed(TEXTS), initial.embed(TEXTS, pooling="mean", normalize=True), atol=1e-3)

    from sentence_transformers import SentenceTransformer

    exported = bert_jax.save_pretrained(model, tmp_path / "st", format="sentence-transformers")
    st_model = SentenceTransformer(str(exported), device="cpu")
    assert st_model.max_seq_length == 64
    long_text = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # cut at 64 tokens by both
    np.testing.assert_allclose(st_model.encode(TEXTS + [long_text]), model.embed(TEXTS + [long_text]), atol=1e-5,
                               rtol=0)


def test_pairs_files_are_checked_row_by_row(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"query": "q1", "positive": "p1"}\n\n{"query": "q2", "positive": "p2"}\n')
    assert pairs_lib.read_pairs(str(good)) == pairs_lib.Pairs(["q1", "q2"], ["p1", "p2"], None)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"query": "q1", "positive": "p1", "negative": "n1"}\n{"query": "q2", "positive": "p2"}\n')
    with pytest.raises(pairs_lib.PairsDataError, match=r"mixed.jsonl, line 2: no 'negative'"):
        pairs_lib.read_pairs(str(mixed))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"query": "q1"}\n')
    with pytest.raises(pairs_lib.PairsDataError, match=r"broken.jsonl, line 1: 'positive' is missing"):
        pairs_lib.read_pairs(f"{good},{broken}")
    with pytest.raises(pairs_lib.PairsDataError, match="matches no file"):
        pairs_lib.read_pairs(str(tmp_path / "none-*.jsonl"))


def test_parquet_pairs_read_as_json_lines(data, tmp_path):
    pairs_file = data[1] / "pairs.jsonl"
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows[:40]), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[40:]), tmp_path / "b.parquet")
    assert pairs_lib.read_pairs(str(tmp_path / "*.parquet")) == pairs_lib.read_pairs(str(pairs_file))


def test_settings_are_checked_before_the_workdir_is_made(data, tmp_path):
    init, squad = data
    for key, value, message in (("init", "", "config.init is empty"), ("pooling", "max", "config.pooling"),
                                ("temperature", 0.0, "config.temperature"),
                                ("max_query_length", 1000, "config.max_query_length=1000")):
        config = embed_config(init, squad)
        config[key] = value
        with pytest.raises(embed_train.EmbedConfigError, match=message):
            embed_train.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
