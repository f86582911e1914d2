"""Counter-based random numbers in the tf graph: a hash of (seed, stream, example id, copy, position...).

Each example needs its own stream so that its pair choices and masks depend only on (seed, example id, epoch or
copy), whatever batch it lands in. `tf.random.stateless_uniform` takes one seed per call, so instead every element
hashes its own keys (murmur3's mixing of 32-bit words), which vectorizes over a whole batch.
"""
from __future__ import annotations

import enum

import tensorflow as tf


class Stream(enum.IntEnum):
    """One independent stream per random decision, so that changing one never shifts another."""
    SPLIT = 1
    PAIR_LABEL = 2
    OTHER_DOC = 3
    OTHER_SENTENCE = 4
    SHORT_SEQ = 5
    TARGET_LENGTH = 6
    TRUNCATE_A = 7
    TRUNCATE_B = 8
    NGRAM = 9
    SPAN_ORDER = 10
    REPLACE = 11
    RANDOM_TOKEN = 12
    EPOCH_ORDER = 13


def _u32(x):
    return tf.cast(x, tf.uint32) if x.dtype != tf.int64 else tf.cast(tf.bitwise.bitwise_and(x, 0xFFFFFFFF), tf.uint32)


def _rotl(x, r):
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(x, tf.constant(r, tf.uint32)),
                                 tf.bitwise.right_shift(x, tf.constant(32 - r, tf.uint32)))


def _mix(h, k):
    k = _rotl(k * tf.constant(0xCC9E2D51, tf.uint32), 15) * tf.constant(0x1B873593, tf.uint32)
    h = _rotl(tf.bitwise.bitwise_xor(h, k), 13)
    return h * tf.constant(5, tf.uint32) + tf.constant(0xE6546B64, tf.uint32)


def _finalize(h):
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))
    h = h * tf.constant(0x85EBCA6B, tf.uint32)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(13, tf.uint32)))
    h = h * tf.constant(0xC2B2AE35, tf.uint32)
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))


def hash_bits(*keys) -> tf.Tensor:
    """uint32 hash of integer keys (tensors or Python ints; broadcast together). int64 keys use their low 32 bits."""
    h = tf.constant(0x9747B28C, tf.uint32)
    for key in keys:
        h = _mix(h, _u32(tf.convert_to_tensor(int(key) if isinstance(key, int) else key)))
    return _finalize(h)


def uniform(*keys) -> tf.Tensor:
    """float32 in [0, 1), a pure function of the keys (see `hash_bits`)."""
    bits = tf.bitwise.right_shift(hash_bits(*keys), tf.constant(8, tf.uint32))
    return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))


def randint(maxval, *keys) -> tf.Tensor:
    """int32 uniform in [0, maxval) (maxval >= 1, broadcast with the keys)."""
    maxval = tf.cast(maxval, tf.float32)
    return tf.cast(tf.minimum(tf.floor(uniform(*keys) * maxval), maxval - 1), tf.int32)
