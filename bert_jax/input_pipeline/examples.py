"""Training examples per objective, built in the tf graph from a host's documents held as flat arrays.

An *example* is a chunk of consecutive sentences, cut once when the pipeline starts (greedily, up to the content
length of a sequence). What happens to a chunk in a given epoch is a pure function of (seed, example id, copy):
- nsp_pairs (BERT): split at a random sentence boundary into A and B; half the time B is replaced by text from a
  random sentence of another document (label 1 = random next). The pair is cut to a target length, which is
  shorter with probability short_seq_prob, by trimming the longer segment (front or back at random) as BERT does.
  Tokens after A that are not used when B is random are dropped rather than put back (BERT reuses them).
- sop_pairs (ALBERT): the same split; half the time A and B are swapped (label 1 = swapped).
- full_sentences (RoBERTa): chunks may cross document boundaries; a separator token marks each crossing.
- doc_sentences: chunks stop at the end of each document.
- packed_documents (ModernBERT's unpadded packing): the corpus stream cut into full sequences wherever they end,
  sentences split at the cut; every sequence is full but the last, so no slot is padding.
Layouts: pairs `[CLS] A [SEP] B [SEP]`; packed `[CLS] text [SEP]` (RoBERTa spells them <s> and </s>).
A chunk of a single sentence is split inside the sentence; sentences longer than a sequence are cut into pieces
(counted as `long_sentences_split`), and chunks of fewer than 2 tokens are dropped.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterable

import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax.input_pipeline.config import PAIR_KINDS
from bert_jax.input_pipeline.randomness import Stream, randint, uniform

LABEL_KEY = {"nsp_pairs": "next_sentence_labels", "sop_pairs": "sentence_order_labels"}


def content_length(kind: str, seq_length: int) -> int:
    """Tokens of text a sequence holds: all but [CLS] and one [SEP] per segment."""
    return seq_length - (3 if kind in PAIR_KINDS else 2)


@dataclasses.dataclass
class Corpus:
    """A host's documents as flat arrays. Tokens form one stream: documents joined by one separator token."""
    tokens: np.ndarray  # int32[T]
    sentence_starts: np.ndarray  # int32[N] offsets into tokens
    sentence_lengths: np.ndarray  # int32[N]
    document_first_sentence: np.ndarray  # int32[D]
    document_num_sentences: np.ndarray  # int32[D]


@dataclasses.dataclass
class Chunks:
    """Examples: runs of whole sentences, as sentence ranges and token ranges of the corpus stream."""
    first_sentence: np.ndarray
    num_sentences: np.ndarray
    start: np.ndarray
    end: np.ndarray
    document: np.ndarray


def build_corpus(documents: Iterable[tuple[np.ndarray, np.ndarray]], separator_id: int,
                 max_sentence_length: int) -> tuple[Corpus, int]:
    """Concatenate (token_ids, sentence_lengths) documents; returns the corpus and how many sentences were split."""
    tokens, lengths, num_sentences = [], [], []
    for doc_tokens, doc_lengths in documents:
        tokens += [doc_tokens, np.array([separator_id], np.int32)]
        lengths.append(doc_lengths)
        num_sentences.append(len(doc_lengths))
    if len(num_sentences) < 2:
        raise ValueError(f"need at least 2 documents with 2 or more sentences, found {len(num_sentences)}")
    lengths, num_sentences = np.concatenate(lengths), np.array(num_sentences, np.int64)
    # Each document is followed by one separator in the stream, so sentence starts skip one token per document.
    doc_of_sentence = np.repeat(np.arange(len(num_sentences)), num_sentences)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + doc_of_sentence
    pieces = np.maximum(1, -(-lengths // max_sentence_length))  # ceil division
    num_split = int(np.sum(pieces > 1))
    if num_split:
        # Cut long sentences into pieces of max_sentence_length (the last piece holds the rest).
        piece_index = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        starts = np.repeat(starts, pieces) + piece_index * max_sentence_length
        lengths = np.minimum(np.repeat(lengths, pieces) - piece_index * max_sentence_length, max_sentence_length)
        num_sentences = np.add.reduceat(pieces, np.cumsum(num_sentences) - num_sentences)
    first = np.cumsum(num_sentences) - num_sentences
    corpus = Corpus(np.concatenate(tokens), starts.astype(np.int32), lengths.astype(np.int32),
                    first.astype(np.int32), num_sentences.astype(np.int32))
    return corpus, num_split


def build_chunks(corpus: Corpus, max_tokens: int, cross_documents: bool) -> Chunks:
    """Pack consecutive sentences greedily into chunks of at most max_tokens (separators included)."""
    doc_of_sentence = np.repeat(np.arange(len(corpus.document_num_sentences)), corpus.document_num_sentences)
    chunk_starts, total, previous_doc = [], 0, -1
    for i, (length, doc) in enumerate(zip(corpus.sentence_lengths.tolist(), doc_of_sentence.tolist())):
        new_doc = doc != previous_doc
        extra = length + (1 if new_doc else 0)
        if not chunk_starts or (new_doc and not cross_documents) or total + extra > max_tokens:
            chunk_starts.append(i)
            total = length
        else:
            total += extra
        previous_doc = doc
    first = np.array(chunk_starts, np.int64)
    num = np.diff(np.append(first, len(corpus.sentence_lengths)))
    last = first + num - 1
    start = corpus.sentence_starts[first]
    end = corpus.sentence_starts[last] + corpus.sentence_lengths[last]
    keep = end - start >= 2
    if not keep.all():
        logging.info("dropping %d chunks of fewer than 2 tokens", int((~keep).sum()))
    return Chunks(first[keep].astype(np.int32), num[keep].astype(np.int32), start[keep].astype(np.int32),
                  end[keep].astype(np.int32), doc_of_sentence[first[keep]].astype(np.int32))


def build_windows(corpus: Corpus, max_tokens: int) -> Chunks:
    """packed_documents: consecutive windows of max_tokens tokens of the corpus stream (separators included)."""
    start = np.arange(0, len(corpus.tokens), max_tokens, dtype=np.int64)
    end = np.minimum(start + max_tokens, len(corpus.tokens))
    keep = end - start >= 2
    start, end = start[keep], end[keep]
    first = np.searchsorted(corpus.sentence_starts, start, side="right") - 1
    last = np.searchsorted(corpus.sentence_starts, end - 1, side="right") - 1
    document = np.searchsorted(corpus.document_first_sentence, np.maximum(first, 0), side="right") - 1
    as_int32 = lambda x: np.asarray(x, np.int32)
    return Chunks(as_int32(np.maximum(first, 0)), as_int32(last - np.maximum(first, 0) + 1), as_int32(start),
                  as_int32(end), as_int32(document))


class ExampleBuilder:
    """Turns [B] example ids and copies into [B, S] token tensors for one example kind (graph ops only)."""

    def __init__(self, corpus: Corpus, kind: str, seq_length: int, special, short_seq_prob: float = 0.1):
        self.kind, self.seq_length, self.special, self.short_seq_prob = kind, seq_length, special, short_seq_prob
        self.max_tokens = content_length(kind, seq_length)
        self.chunks = (build_windows(corpus, self.max_tokens) if kind == "packed_documents" else
                       build_chunks(corpus, self.max_tokens, cross_documents=kind == "full_sentences"))
        self.num_examples = len(self.chunks.start)
        t = functools.partial(tf.constant, dtype=tf.int32)
        self._tokens = t(corpus.tokens)
        self._sentence_starts = t(corpus.sentence_starts)
        self._doc_first_sentence = t(corpus.document_first_sentence)
        self._doc_num_sentences = t(corpus.document_num_sentences)
        last = corpus.document_first_sentence + corpus.document_num_sentences - 1
        self._doc_end = t(corpus.sentence_starts[last] + corpus.sentence_lengths[last])
        self._num_docs = len(corpus.document_num_sentences)
        self._num_sentences = len(corpus.sentence_starts)
        self._chunk = {k: t(v) for k, v in dataclasses.asdict(self.chunks).items()}

    def packing_efficiency(self) -> float:
        """Real tokens ([CLS], text, [SEP]s) over the slots of one epoch of examples, for the packed kinds (pairs
        vary by epoch); the trainer logs the same ratio per step."""
        return float((self.chunks.end - self.chunks.start + 2).sum() / (self.num_examples * self.seq_length))

    def __call__(self, seed, process_index, example_ids, copies) -> dict[str, tf.Tensor]:
        """input_ids, input_mask, segment_ids, plus the pair label or packing_segment_ids; all int32."""
        keys = (seed, process_index, example_ids, copies)
        if self.kind in PAIR_KINDS:
            return self._pairs(keys, example_ids)
        return self._packed(example_ids)

    def _packed(self, example_ids):
        start = tf.gather(self._chunk["start"], example_ids)[:, None]
        length = tf.gather(self._chunk["end"], example_ids)[:, None] - start
        p = tf.range(self.seq_length)[None, :]
        inside = (p >= 1) & (p <= length)
        ids = tf.where(inside, tf.gather(self._tokens, tf.where(inside, start + p - 1, 0)),
                       tf.where(p == 0, self.special.cls, tf.where(p == length + 1, self.special.sep,
                                                                     self.special.pad)))
        input_mask = p <= length + 1
        # Packing segment ids: 1 for the first document, +1 after each separator crossed; 0 on padding.
        is_sep = tf.cast(inside & tf.equal(ids, self.special.sep), tf.int32)
        packing = tf.where(input_mask, 1 + tf.cumsum(is_sep, axis=1, exclusive=True), 0)
        return dict(input_ids=ids, input_mask=tf.cast(input_mask, tf.int32),
                    segment_ids=tf.zeros_like(ids), packing_segment_ids=packing)

    def _pairs(self, keys, example_ids):
        c = {k: tf.gather(v, example_ids) for k, v in self._chunk.items()}
        a_start, chunk_end, n = c["start"], c["end"], c["num_sentences"]
        # A ends at a random sentence boundary inside the chunk, or inside its only sentence.
        split_sentence = c["first_sentence"] + 1 + randint(tf.maximum(n - 1, 1), Stream.SPLIT, *keys)
        boundary = tf.gather(self._sentence_starts, tf.minimum(split_sentence, self._num_sentences - 1))
        inner = a_start + 1 + randint(chunk_end - a_start - 1, Stream.SPLIT, *keys)
        b_start = tf.where(n >= 2, boundary, inner)
        a_len, b_len = b_start - a_start, chunk_end - b_start
        label = uniform(Stream.PAIR_LABEL, *keys) < 0.5
        if self.kind == "nsp_pairs":
            other_start, other_len = self._random_other_text(keys, c["document"])
            b_start = tf.where(label, other_start, b_start)
            b_len = tf.where(label, tf.minimum(other_len, self.max_tokens - a_len), b_len)
        (a_start, a_len), (b_start, b_len) = self._truncate_pair(keys, (a_start, a_len), (b_start, b_len))
        if self.kind == "sop_pairs":
            (a_start, a_len), (b_start, b_len) = ((tf.where(label, b_start, a_start), tf.where(label, b_len, a_len)),
                                                  (tf.where(label, a_start, b_start), tf.where(label, a_len, b_len)))
        features = self._pair_layout(a_start, a_len, b_start, b_len)
        features[LABEL_KEY[self.kind]] = tf.cast(label, tf.int32)
        return features

    def _random_other_text(self, keys, document):
        """BERT's random next: from a random sentence of another document to that document's end."""
        other = (document + 1 + randint(self._num_docs - 1, Stream.OTHER_DOC, *keys)) % self._num_docs
        sentence = tf.gather(self._doc_first_sentence, other) + randint(
            tf.gather(self._doc_num_sentences, other), Stream.OTHER_SENTENCE, *keys)
        start = tf.gather(self._sentence_starts, sentence)
        return start, tf.gather(self._doc_end, other) - start

    def _truncate_pair(self, keys, a, b):
        """BERT's truncate_seq_pair in closed form: trim the longer segment, one token at a time, to the target."""
        short = uniform(Stream.SHORT_SEQ, *keys) < self.short_seq_prob
        target = tf.where(short, 2 + randint(self.max_tokens - 1, Stream.TARGET_LENGTH, *keys), self.max_tokens)
        (a_start, a_len), (b_start, b_len) = a, b
        excess = tf.maximum(a_len + b_len - target, 0)
        first = tf.minimum(excess, tf.abs(a_len - b_len))  # evens out the longer one
        rest = excess - first  # then alternately, starting with B (ties trim B)
        cut_a = tf.where(a_len > b_len, first, 0) + rest // 2
        cut_b = tf.where(a_len > b_len, 0, first) + rest - rest // 2
        # BERT picks front or back per token; here a random share of the cut comes off the front.
        a_start += randint(cut_a + 1, Stream.TRUNCATE_A, *keys)
        b_start += randint(cut_b + 1, Stream.TRUNCATE_B, *keys)
        return (a_start, a_len - cut_a), (b_start, b_len - cut_b)

    def _pair_layout(self, a_start, a_len, b_start, b_len):
        a_start, a_len, b_start, b_len = (x[:, None] for x in (a_start, a_len, b_start, b_len))
        p = tf.range(self.seq_length)[None, :]
        in_a = (p >= 1) & (p <= a_len)
        in_b = (p >= a_len + 2) & (p <= a_len + b_len + 1)
        source = tf.where(in_a, a_start + p - 1, tf.where(in_b, b_start + p - a_len - 2, 0))
        is_sep = (p == a_len + 1) | (p == a_len + b_len + 2)
        ids = tf.where(in_a | in_b, tf.gather(self._tokens, source),
                       tf.where(p == 0, self.special.cls, tf.where(is_sep, self.special.sep, self.special.pad)))
        input_mask = p <= a_len + b_len + 2
        segment_ids = (p >= a_len + 2) & input_mask
        return dict(input_ids=ids, input_mask=tf.cast(input_mask, tf.int32),
                    segment_ids=tf.cast(segment_ids, tf.int32))
