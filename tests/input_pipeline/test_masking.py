"""Masking statistics over a large synthetic sample, and whole-word masking on real text."""
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.input_pipeline import masking
from bert_jax.input_pipeline.pipeline import PretrainingPipeline
from bert_jax.input_pipeline.tokenizers import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000
B, S = 4000, 128


def masking_config(**overrides):
    config = config_lib.load_preset("bert", "tiny").masking.to_dict()
    config.update(overrides)
    return ml_collections.ConfigDict(config)


def synthetic_batch(seed=0):
    """[CLS] A [SEP] B [SEP] pad, random lengths, random ordinary ids (>= 5)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, S), np.int32)
    a_len = rng.integers(5, 60, B)
    total = np.minimum(a_len + rng.integers(5, 80, B), S - 3)
    for i in range(B):
        ids[i, 1:total[i] + 3] = rng.integers(5, VOCAB, total[i] + 2)
        ids[i, [0, a_len[i] + 1, total[i] + 2]] = [SPECIAL.cls, SPECIAL.sep, SPECIAL.sep]
    return dict(input_ids=tf.constant(ids), input_mask=tf.constant((ids != 0).astype(np.int32)))


def run(config, features, copies=0):
    masker = masking.Masker(config, SPECIAL, VOCAB, np.ones(VOCAB, bool))
    keys = (0, 0, tf.range(B), tf.fill([B], copies))
    return {k: v.numpy() for k, v in masker(features, keys).items()}


@pytest.fixture(scope="module")
def features():
    return synthetic_batch()


def chosen_mask(out):
    chosen = np.zeros_like(out["input_ids"], bool)
    rows = np.repeat(np.arange(B), out["masked_lm_positions"].shape[1])
    chosen[rows, out["masked_lm_positions"].ravel()] |= out["masked_lm_weights"].ravel() > 0
    return chosen


def test_rate_and_cap(features):
    original = features["input_ids"].numpy()
    candidates = (original > SPECIAL.sep).sum(1)
    uncapped = run(masking_config(max_predictions_per_seq=S), features)
    assert abs(uncapped["masked_lm_weights"].sum() / candidates.sum() - 0.15) < 0.01
    capped = run(masking_config(max_predictions_per_seq=10), features)
    per_row = capped["masked_lm_weights"].sum(1)
    assert per_row.max() == 10 and per_row.min() >= 1
    np.testing.assert_array_equal(per_row, np.minimum(10, np.maximum(1, np.round(candidates * 0.15))))
    unlisted = ~chosen_mask(capped)
    np.testing.assert_array_equal(capped["input_ids"][unlisted], original[unlisted])  # nothing masked beyond the cap


def test_replacement_split_and_specials(features):
    original = features["input_ids"].numpy()
    out = run(masking_config(max_predictions_per_seq=S), features)
    chosen = chosen_mask(out)
    assert not (chosen & (original <= SPECIAL.sep)).any(), "a special token or padding was masked"
    np.testing.assert_array_equal(out["input_ids"][~chosen], original[~chosen])
    # masked_lm_ids are the original tokens at the masked positions.
    valid = out["masked_lm_weights"] > 0
    np.testing.assert_array_equal(out["masked_lm_ids"][valid],
                                  np.take_along_axis(original, out["masked_lm_positions"], 1)[valid])
    new, old = out["input_ids"][chosen], original[chosen]
    as_mask, kept = np.mean(new == SPECIAL.mask), np.mean(new == old)
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1 - 1 / VOCAB) < 0.02
    assert abs(1 - as_mask - kept - 0.1) < 0.02
    electra = run(masking_config(max_predictions_per_seq=S, mask_token_prob=0.85, random_token_prob=0.0), features)
    new = electra["input_ids"][chosen_mask(electra)]
    assert abs(np.mean(new == SPECIAL.mask) - 0.85) < 0.02 and np.all(np.isin(new, [SPECIAL.mask, *range(5, VOCAB)]))


def test_ngram_lengths_follow_one_over_n(features):
    config = masking_config(ngram_max=3, max_predictions_per_seq=S)
    masker = masking.Masker(config, SPECIAL, VOCAB, np.ones(VOCAB, bool))
    ids = features["input_ids"]
    keys = (0, 0, tf.range(B)[:, None], tf.zeros([B, 1], tf.int32))
    chosen, starts = (x.numpy() for x in masker.choose(ids, masker.candidates(ids, features["input_mask"]), keys))
    span_id = np.cumsum(starts, 1) - 1
    drawn, taken = [], []
    for row in range(B):
        length = np.bincount(span_id[row], minlength=S)
        content = np.unique(span_id[row][ids.numpy()[row] > SPECIAL.sep])
        chosen_spans = np.unique(span_id[row][chosen[row]])
        drawn += length[content].tolist()
        taken += length[chosen_spans].tolist()
        # Spans are masked whole: every token of a chosen span is chosen.
        assert chosen[row][np.isin(span_id[row], chosen_spans)].all()
    expected = masking.ngram_probabilities(3)
    np.testing.assert_allclose(np.bincount(drawn, minlength=4)[1:4] / len(drawn), expected, atol=0.02)
    # Taking spans while the budget lasts favours short ones a little (see masking's docstring).
    np.testing.assert_allclose(np.bincount(taken, minlength=4)[1:4] / len(taken), expected, atol=0.05)


@pytest.fixture(scope="module")
def whole_word_pipeline():
    config = config_lib.load_preset("bert", "tiny")
    config.masking.whole_word = True
    return PretrainingPipeline(config)


def test_whole_words_masked_together(whole_word_pipeline):
    pipeline = whole_word_pipeline
    out = {k: v.numpy() for k, v in pipeline.build(tf.range(512), tf.zeros([512], tf.int32)).items()}
    original = out["input_ids"].copy()
    rows = np.repeat(np.arange(512), out["masked_lm_positions"].shape[1])
    valid = out["masked_lm_weights"].ravel() > 0
    original[rows[valid], out["masked_lm_positions"].ravel()[valid]] = out["masked_lm_ids"].ravel()[valid]
    chosen = np.zeros_like(original, bool)
    chosen[rows[valid], out["masked_lm_positions"].ravel()[valid]] = True
    starts = pipeline.tokenizer.word_start_table()[original]
    special = pipeline.tokenizer.special
    starts[:, 1:] |= np.isin(original[:, :-1], [special.cls, special.sep])  # a segment may begin mid-word
    word_id = np.cumsum(starts, axis=1)
    continuations = 0
    for row in range(512):
        for word in np.unique(word_id[row][chosen[row]]):
            in_word = word_id[row] == word
            assert chosen[row][in_word].all(), pipeline.tokenizer.decode(original[row][in_word])
            continuations += in_word.sum() - 1
    assert continuations > 50  # the sample did contain multi-piece words


def test_copies_static_and_dynamic(whole_word_pipeline):
    """Static D=10 over 40 epochs uses each copy exactly 4 times; D=1 repeats masks; dynamic never repeats."""
    pipeline = whole_word_pipeline
    config = pipeline.config
    example = tf.fill([40], 7)

    def masks(mode, dupe_factor):
        config.masking.mode, config.masking.dupe_factor = mode, dupe_factor
        out = pipeline.build(example, tf.range(40))
        return [tuple(row) for row in np.concatenate([out["masked_lm_positions"], out["input_ids"]], 1).tolist()]

    try:
        static10 = masks("static", 10)
        counts = {m: static10.count(m) for m in set(static10)}
        assert len(counts) == 10 and set(counts.values()) == {4}
        assert all(static10[e] == static10[e % 10] for e in range(40))
        assert len(set(masks("static", 1))) == 1
        assert len(set(masks("dynamic", 10))) == 40
    finally:
        config.masking.mode, config.masking.dupe_factor = "static", 10


def test_ngram_whole_word_rate_on_real_text():
    """ALBERT's preset (whole words, n-grams up to 3) still predicts 15% +- 1% of the candidates."""
    config = config_lib.load_preset("albert", "tiny")
    config.masking.max_predictions_per_seq = config.data.seq_length
    pipeline = PretrainingPipeline(config)
    out = {k: v.numpy() for k, v in pipeline.build(tf.range(2000), tf.zeros([2000], tf.int32)).items()}
    special = pipeline.tokenizer.special
    candidates = (out["input_mask"] > 0) & ~np.isin(out["input_ids"], [special.cls, special.sep])
    assert abs(out["masked_lm_weights"].sum() / candidates.sum() - 0.15) < 0.01


def test_the_masking_rate_follows_its_schedule_by_step_and_resumes_by_step():
    """mmBERT-style annealing: 30% from step 0, 15% from step 2, 5% from step 4, on the packed ModernBERT examples;
    a pipeline started at step 3 gives step 3's batch exactly."""
    from bert_jax.input_pipeline import make_pretraining_dataset

    config = config_lib.load_preset("modernbert", "tiny")
    config.data.update(seq_length=128, batch_size=64)
    config.masking.update(rate_schedule="0:0.3,2:0.15,4:0.05", max_predictions_per_seq=128)
    batches = [b for _, b in zip(range(5), make_pretraining_dataset(config))]
    rates = [b["masked_lm_weights"].sum() / (b["input_mask"].sum() - 2 * len(b["input_mask"])) for b in batches]
    np.testing.assert_allclose(rates, [0.3, 0.3, 0.15, 0.15, 0.05], atol=0.01)  # [CLS], [SEP] are never masked
    resumed = next(make_pretraining_dataset(config, start_step=3))
    assert all(np.array_equal(resumed[k], batches[3][k]) for k in resumed)
    from bert_jax.train import pretraining_batch_metrics  # and metrics.jsonl logs the rate of each step

    logged = [float(pretraining_batch_metrics(b, step, masking=config.masking)["masking_rate"])
              for step, b in enumerate(batches)]
    np.testing.assert_allclose(logged, [0.3, 0.3, 0.15, 0.15, 0.05])


@pytest.mark.parametrize("schedule", ["0.3", "1:0.3", "0:0.3,0:0.2", "0:1.5"])
def test_a_bad_rate_schedule_names_the_key(schedule):
    from bert_jax.input_pipeline.pipeline import DataConfigError, validate

    config = config_lib.load_preset("modernbert", "tiny")
    config.masking.rate_schedule = schedule
    with pytest.raises(DataConfigError, match=f"config.masking.rate_schedule='{schedule}': .* e.g. '0:0.3"):
        validate(config, 1)
