"""The tiny presets end to end: batch shapes and keys, determinism, resume by step, epochs, process sharding."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.input_pipeline import make_pretraining_dataset
from bert_jax.input_pipeline.pipeline import DataConfigError, PretrainingPipeline

LABEL = {"bert": "next_sentence_labels", "albert": "sentence_order_labels", "roberta": "packing_segment_ids",
         "electra": "packing_segment_ids"}


def tiny(family, batch_size=8):
    config = config_lib.load_preset(family, "tiny")
    config.data.batch_size = batch_size
    return config


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra"])
def test_tiny_presets_give_fixed_shape_int32_batches(family):
    config = tiny(family)
    batch = next(make_pretraining_dataset(config))
    S, P = config.data.seq_length, config.masking.max_predictions_per_seq
    expected = dict(input_ids=(8, S), input_mask=(8, S), segment_ids=(8, S), masked_lm_positions=(8, P),
                    masked_lm_ids=(8, P), masked_lm_weights=(8, P))
    expected[LABEL[family]] = (8,) if family in ("bert", "albert") else (8, S)
    assert {k: v.shape for k, v in batch.items()} == expected
    assert all(v.dtype == np.int32 for v in batch.values())
    assert batch["input_ids"].max() < config.model.vocab_size
    assert (batch["masked_lm_weights"].sum(1) > 0).all()


@pytest.fixture(scope="module")
def bert():
    return PretrainingPipeline(tiny("bert", batch_size=16))


def take(dataset, n):
    return list(itertools.islice(dataset.as_numpy_iterator(), n))


def test_resume_at_step_sees_the_same_batches(bert):
    run = take(bert.dataset(0), 6)
    resumed = take(bert.dataset(4 * bert.local_batch_size), 2)
    for a, b in zip(run[4:], resumed):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(run[0]["input_ids"], run[1]["input_ids"])


def test_make_pretraining_dataset_resumes_by_step():
    config = tiny("albert", batch_size=4)
    first = list(itertools.islice(make_pretraining_dataset(config), 3))
    resumed = next(make_pretraining_dataset(config, start_step=2))
    assert all(np.array_equal(first[2][k], resumed[k]) for k in resumed)


def test_each_epoch_is_a_new_permutation(bert):
    n = bert.num_examples
    ids, epochs = (x.numpy() for x in bert.example_ids_at(tf.range(2 * n)))
    assert sorted(ids[:n]) == list(range(n)) and sorted(ids[n:]) == list(range(n))
    assert (epochs[:n] == 0).all() and (epochs[n:] == 1).all()
    assert not np.array_equal(ids[:n], ids[n:]) and not np.array_equal(ids[:n], np.arange(n))


def test_nsp_labels_balanced_over_an_epoch(bert):
    out = bert.build(tf.range(bert.num_examples), tf.zeros([bert.num_examples], tf.int32))
    assert abs(out["next_sentence_labels"].numpy().mean() - 0.5) < 0.03


def test_processes_read_disjoint_files():
    config = tiny("roberta", batch_size=8)
    hosts = [PretrainingPipeline(config, i, 2) for i in range(2)]
    assert [h.local_batch_size for h in hosts] == [4, 4]
    # Three corpus files: host 0 reads files 0 and 2, host 1 reads file 1.
    assert hosts[0].num_examples > hosts[1].num_examples > 0
    batches = [next(h.dataset(0).as_numpy_iterator()) for h in hosts]
    assert not np.array_equal(batches[0]["input_ids"], batches[1]["input_ids"])


@pytest.mark.parametrize("key, value, match", [
    ("data.example_kind", "pairs", "config.data.example_kind='pairs'"),
    ("data.batch_size", 7, "config.data.batch_size=7: must be a positive multiple of the process count 2"),
    ("masking.max_predictions_per_seq", 500, "config.masking.max_predictions_per_seq=500"),
    ("masking.mode", "sometimes", "config.masking.mode='sometimes'"),
    ("data.input_files", "no/such/*.txt", "config.data.input_files: 'no/such/\\*.txt' matches no file"),
    ("data.tokenizer_path", "no/such/vocab.txt", "tokenizer file .*no/such/vocab.txt does not exist"),
])
def test_bad_config_names_the_key(key, value, match):
    config = tiny("bert")
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises((DataConfigError, FileNotFoundError, ValueError), match=match):
        PretrainingPipeline(config, 0, 2)
