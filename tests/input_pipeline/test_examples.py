"""Pair construction, labels and packing on a synthetic corpus whose token ids spell out where they came from."""
import numpy as np
import pytest
import tensorflow as tf

from bert_jax.input_pipeline import examples
from bert_jax.input_pipeline.tokenizers import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
S = 64
DOC_STRIDE = 10_000  # token id = DOC_STRIDE * (doc + 1) + offset inside the document


def synthetic_documents(num_docs=400, seed=0):
    rng = np.random.default_rng(seed)
    for d in range(num_docs):
        lengths = rng.integers(3, 25, rng.integers(2, 12)).astype(np.int32)
        yield DOC_STRIDE * (d + 1) + np.arange(lengths.sum(), dtype=np.int32), lengths


def build(kind, short_seq_prob=0.0, docs=None):
    corpus, _ = examples.build_corpus(docs or synthetic_documents(), SPECIAL.sep, S - 3)
    builder = examples.ExampleBuilder(corpus, kind, S, SPECIAL, short_seq_prob)
    n = builder.num_examples
    out = builder(0, 0, tf.range(n), tf.zeros([n], tf.int32))
    return builder, {k: v.numpy() for k, v in out.items()}


def segments(row_ids, row_segments, row_mask):
    """(A, B) token ids of a [CLS] A [SEP] B [SEP] row, checking the layout on the way."""
    length = row_mask.sum()
    assert row_ids[0] == SPECIAL.cls and row_ids[length - 1] == SPECIAL.sep and not row_ids[length:].any()
    first_sep = np.flatnonzero(row_ids == SPECIAL.sep)[0]
    np.testing.assert_array_equal(row_segments[:length], np.arange(length) > first_sep)
    return row_ids[1:first_sep], row_ids[first_sep + 1:length - 1]


def is_contiguous(tokens):
    return np.all(np.diff(tokens) == 1)


@pytest.mark.parametrize("kind", ["nsp_pairs", "sop_pairs"])
def test_pairs(kind):
    builder, out = build(kind)
    labels = out[examples.LABEL_KEY[kind]]
    assert builder.num_examples > 700 and abs(labels.mean() - 0.5) < 0.06
    for ids, seg, mask, label in zip(out["input_ids"], out["segment_ids"], out["input_mask"], labels):
        a, b = segments(ids, seg, mask)
        assert len(a) and len(b) and is_contiguous(a) and is_contiguous(b)
        if kind == "nsp_pairs":
            # Is-next pairs continue the text; random ones come from another document.
            assert (b[0] == a[-1] + 1) if label == 0 else (b[0] // DOC_STRIDE != a[0] // DOC_STRIDE)
        else:
            # Sentence order: label 1 means B is the text that came before A.
            assert (b[0] == a[-1] + 1) if label == 0 else (a[0] == b[-1] + 1)


def test_short_targets_truncate_pairs():
    _, full = build("nsp_pairs")
    _, short = build("nsp_pairs", short_seq_prob=1.0)
    assert short["input_mask"].sum(1).mean() < 0.75 * full["input_mask"].sum(1).mean()
    assert short["input_mask"].sum(1).min() >= 5 and full["input_mask"].sum(1).max() <= S


@pytest.mark.parametrize("kind", ["full_sentences", "doc_sentences"])
def test_packing(kind):
    builder, out = build(kind)
    crossings = 0
    for ids, mask, packing in zip(out["input_ids"], out["input_mask"], out["packing_segment_ids"]):
        length = mask.sum()
        assert ids[0] == SPECIAL.cls and ids[length - 1] == SPECIAL.sep and not packing[length:].any()
        pieces = np.split(ids[1:length - 1], np.flatnonzero(ids[1:length - 1] == SPECIAL.sep))
        pieces = [p[p != SPECIAL.sep] for p in pieces]
        # Each piece between separators is contiguous text of one document, with its own packing id.
        assert all(len(p) and is_contiguous(p) for p in pieces)
        assert len({p[0] // DOC_STRIDE for p in pieces}) == len(pieces)
        assert packing[0] == 1 and packing[length - 1] == len(pieces)
        crossings += len(pieces) - 1
    assert (crossings > 0) == (kind == "full_sentences")
    # Sentences are not cut: every chunk starts at a sentence start.
    assert np.isin(builder.chunks.start, examples.build_corpus(synthetic_documents(), SPECIAL.sep, S - 3)[0]
                   .sentence_starts).all()


def test_long_sentences_are_split():
    docs = [(np.arange(1, 301, dtype=np.int32) + DOC_STRIDE, np.array([10, 250, 40], np.int32)),
            (np.arange(1, 21, dtype=np.int32) + 2 * DOC_STRIDE, np.array([10, 10], np.int32))]
    corpus, num_split = examples.build_corpus(iter(docs), SPECIAL.sep, S - 3)
    assert num_split == 1 and corpus.sentence_lengths.max() <= S - 3
    assert corpus.sentence_lengths.tolist() == [10, 61, 61, 61, 61, 6, 40, 10, 10]
    np.testing.assert_array_equal(corpus.tokens[corpus.sentence_starts], [1, 11, 72, 133, 194, 255, 261, 1, 11] +
                                  np.array([DOC_STRIDE] * 7 + [2 * DOC_STRIDE] * 2))
    _, out = build("nsp_pairs", docs=iter(docs))
    assert out["input_mask"].sum(1).max() <= S


def test_too_few_documents():
    with pytest.raises(ValueError, match="at least 2 documents"):
        examples.build_corpus(synthetic_documents(num_docs=1), SPECIAL.sep, S - 3)


def test_packed_documents_fill_every_sequence_and_attend_within_documents():
    builder, out = build("packed_documents")
    lengths = out["input_mask"].sum(1)
    assert (lengths[:-1] == S).all() and 2 < lengths[-1] <= S  # only the corpus's last sequence is short
    tokens = np.concatenate([row[1:n - 1] for row, n in zip(out["input_ids"], lengths)])
    np.testing.assert_array_equal(tokens, build_corpus_tokens())  # the whole stream, in order, cut anywhere
    for ids, packing, n in zip(out["input_ids"], out["packing_segment_ids"], lengths):
        seps = np.flatnonzero(ids[1:n - 1] == SPECIAL.sep) + 1  # document ends inside the sequence
        np.testing.assert_array_equal(packing[:n], 1 + np.searchsorted(seps, np.arange(n), side="left"))
    assert builder.packing_efficiency() > 0.999


def build_corpus_tokens():
    corpus, _ = examples.build_corpus(synthetic_documents(), SPECIAL.sep, S - 3)
    return corpus.tokens


def test_packed_documents_reach_95_percent_on_the_bundled_corpus():
    """benchmarks/packing.py's figures: full_sentences fills 84% of the slots at 128 tokens, packed_documents all."""
    from bert_jax import config_lib
    from bert_jax.input_pipeline.pipeline import PretrainingPipeline

    config = config_lib.load_preset("modernbert", "tiny")
    efficiency = {}
    for kind in ("full_sentences", "packed_documents"):
        config.data.example_kind = kind
        efficiency[kind] = PretrainingPipeline(config).examples.packing_efficiency()
    assert efficiency["full_sentences"] < 0.9 and efficiency["packed_documents"] >= 0.95
