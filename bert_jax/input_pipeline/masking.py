"""MLM masking in the tf graph, vectorized over a batch: which tokens to predict, and what replaces them.

Per sequence, k = min(max_predictions_per_seq, max(1, round(rate * #non-special tokens))) tokens are predicted
(BERT's rule, counted over non-special tokens); the rate may change by step (masking.rate_schedule), a function of
the batch's step and so of the example's stream position. Candidates are grouped into units (tokens, or whole words when
`whole_word`), units into spans of n units with p(n) proportional to 1/n for n <= ngram_max (ALBERT's n-gram
masking; spans never contain special tokens), and spans are taken in a random order while the running total of
tokens stays <= k. (BERT skips a word that would overflow and tries the next; taking a prefix is what vectorizes,
so whole-word and n-gram masking can fall short of k by less than one span.) Each chosen token is replaced by
the mask token with mask_token_prob, by a uniformly random vocabulary id with random_token_prob, else kept.
All randomness is keyed by (seed, process, example id, copy, position): see `randomness`.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from bert_jax.input_pipeline.randomness import Stream, hash_bits, randint, uniform


def ngram_probabilities(ngram_max: int) -> np.ndarray:
    """p(n) proportional to 1/n for n = 1..ngram_max (ALBERT)."""
    weights = 1.0 / np.arange(1, ngram_max + 1)
    return weights / weights.sum()


class Masker:
    """Applies one masking config to batches of examples."""

    def __init__(self, masking, special, vocab_size: int, word_start_table: np.ndarray):
        self.config, self.special, self.vocab_size = masking, special, vocab_size
        self._word_start = tf.constant(word_start_table, tf.bool)
        self._ngram_cdf = tf.constant(np.cumsum(ngram_probabilities(masking.ngram_max))[:-1], tf.float32)

    def __call__(self, features: dict, keys, rate=None) -> dict:
        """Adds masked_lm_positions/ids/weights and replaces input_ids; `keys` = (seed, process, ids, copies);
        `rate` (a scalar, default config.rate) is the masking rate of this batch's step."""
        ids = features["input_ids"]
        candidate = self.candidates(ids, features["input_mask"])
        keys = tuple(k[:, None] if isinstance(k, tf.Tensor) and k.shape.rank == 1 else k for k in keys)
        chosen, _ = self.choose(ids, candidate, keys, rate)
        positions, weights = self._positions(chosen)
        position_keys = (*keys, tf.range(tf.shape(ids)[1])[None, :])
        u = uniform(Stream.REPLACE, *position_keys)
        random_ids = randint(self.vocab_size, Stream.RANDOM_TOKEN, *position_keys)
        replacement = tf.where(u < self.config.mask_token_prob, self.special.mask,
                               tf.where(u < self.config.mask_token_prob + self.config.random_token_prob,
                                        random_ids, ids))
        return dict(features, input_ids=tf.where(chosen, replacement, ids), masked_lm_positions=positions,
                    masked_lm_ids=tf.gather(ids, positions, batch_dims=1) * weights, masked_lm_weights=weights)

    def candidates(self, ids, input_mask):
        """Tokens that may be masked: real tokens that are not [CLS], [SEP] or padding."""
        special = (ids == self.special.cls) | (ids == self.special.sep) | (ids == self.special.pad)
        return (input_mask > 0) & ~special

    def choose(self, ids, candidate, keys, rate=None):
        """(chosen bool[B, S], span_start bool[B, S]): the tokens to predict and the spans they were drawn as."""
        rate = self.config.rate if rate is None else rate
        span_start = self.span_starts(ids, candidate, keys)
        batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
        span_id = tf.cumsum(tf.cast(span_start, tf.int32), axis=1) - 1
        flat_span = span_id + tf.range(batch)[:, None] * length
        span_len = tf.reshape(tf.math.unsorted_segment_sum(tf.cast(candidate, tf.int32), flat_span, batch * length),
                              [batch, length])
        num_candidates = tf.reduce_sum(tf.cast(candidate, tf.float32), axis=1)
        budget = tf.minimum(self.config.max_predictions_per_seq,
                            tf.maximum(1, tf.cast(tf.round(num_candidates * rate), tf.int32)))
        # Random span order: the P lowest keys (random bits, then the span index to break ties). At most P spans
        # fit in the budget, so the prefix that fits is among them: every span with a key up to the last that fits.
        span_index = tf.range(length, dtype=tf.int64)[None, :]
        bits = tf.cast(hash_bits(Stream.SPAN_ORDER, *keys, span_index), tf.int64)
        key = tf.where(span_len > 0, bits * (1 << 20) + span_index, tf.int64.max)
        lowest = -tf.math.top_k(-key, k=self.config.max_predictions_per_seq).values
        lowest_len = tf.gather(span_len, tf.cast(tf.minimum(lowest % (1 << 20), tf.cast(length, tf.int64) - 1),
                                                 tf.int32), batch_dims=1)
        fits = (tf.cumsum(lowest_len, axis=1) <= budget[:, None]) & (lowest < tf.int64.max)
        num_taken = tf.reduce_sum(tf.cast(fits, tf.int32), axis=1)
        last_taken = tf.gather(tf.pad(lowest, [[0, 0], [1, 0]], constant_values=-1), num_taken, batch_dims=1)
        take_span = key <= last_taken[:, None]
        return tf.gather(take_span, span_id, batch_dims=1) & candidate, span_start

    def span_starts(self, ids, candidate, keys):
        """Where spans start: at every unit start for ngram_max 1, else every n-th unit with n drawn per span."""
        unit_start = tf.ones_like(candidate)
        if self.config.whole_word:
            previous = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
            unit_start = tf.gather(self._word_start, ids) | ~candidate | ~previous
        if self.config.ngram_max == 1:
            return unit_start
        u = uniform(Stream.NGRAM, *keys, tf.range(tf.shape(ids)[1])[None, :])
        span_units = 1 + tf.reduce_sum(tf.cast(u[..., None] >= self._ngram_cdf, tf.int32), axis=-1)

        def step(remaining, inputs):
            starts_unit, is_candidate, n = inputs
            begins = starts_unit & (~is_candidate | (remaining == 0))
            remaining = tf.where(~starts_unit, remaining,
                                 tf.where(~is_candidate, 0, tf.where(begins, n - 1, remaining - 1)))
            return remaining, begins

        columns = (tf.transpose(unit_start), tf.transpose(candidate), tf.transpose(span_units))
        _, begins = tf.scan(lambda state, x: step(state[0], x),
                            columns, initializer=(tf.zeros_like(ids[:, 0]), tf.zeros_like(candidate[:, 0])))
        return tf.transpose(begins)

    def _positions(self, chosen):
        """The chosen positions in order, padded with 0 to max_predictions_per_seq, and their 0/1 weights."""
        batch, length = tf.shape(chosen)[0], tf.shape(chosen)[1]
        slots = self.config.max_predictions_per_seq
        rank = tf.cumsum(tf.cast(chosen, tf.int32), axis=1, exclusive=True)
        # Scatter each chosen position to slot `rank` of its row; everything else lands in one spare slot.
        slot = tf.where(chosen & (rank < slots), rank + tf.range(batch)[:, None] * slots, batch * slots)
        p = tf.broadcast_to(tf.range(1, length + 1)[None, :], tf.shape(chosen))
        filled = tf.math.unsorted_segment_max(p, slot, batch * slots + 1)[:-1]
        filled = tf.reshape(tf.maximum(filled, 0), [batch, slots])
        return tf.maximum(filled - 1, 0), tf.cast(filled > 0, tf.int32)
