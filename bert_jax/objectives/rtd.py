"""ELECTRA's replaced-token detection: the generator fills the masks, the discriminator spots the replacements.

The generator samples with Gumbel noise on stop-gradient logits (the discriminator's loss does not train it); a
sampled token equal to the original counts as original. Loss = generator MLM + weight * discriminator loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from bert_jax.objectives.mlm import masked_lm, weighted_mean


def sample_tokens(logits, rng):
    """One token per position from softmax(logits), by the Gumbel-max trick; no gradient flows back."""
    logits = jax.lax.stop_gradient(logits)
    return jnp.argmax(logits + jax.random.gumbel(rng, logits.shape, logits.dtype), axis=-1).astype(jnp.int32)


def scatter_positions(input_ids, positions, weights, values):
    """input_ids with values[b, p] written at positions[b, p] where weights[b, p] > 0 (padding writes nothing)."""
    hits = jax.nn.one_hot(positions, input_ids.shape[1], dtype=jnp.int32) * (weights > 0)[..., None]  # [B, P, S]
    written = jnp.sum(hits, axis=1) > 0
    return jnp.where(written, jnp.einsum("bps,bp->bs", hits, values), input_ids)


def corrupt(batch, sampled):
    """(discriminator input ids, is_replaced labels) from the generator's samples at the masked positions."""
    positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
    original = scatter_positions(batch["input_ids"], positions, weights, batch["masked_lm_ids"])
    corrupted = scatter_positions(batch["input_ids"], positions, weights, sampled)
    return corrupted, (corrupted != original).astype(jnp.int32)


def discriminator_metrics(logits, labels, mask):
    """Sigmoid loss over real tokens, with accuracy, precision and recall of 'replaced'."""
    mask = mask.astype(jnp.float32)
    loss = weighted_mean(optax.sigmoid_binary_cross_entropy(logits, labels.astype(jnp.float32)), mask)
    predicted = (logits > 0).astype(jnp.float32) * mask
    actual = labels.astype(jnp.float32) * mask
    true_positives = jnp.sum(predicted * actual)
    return loss, {
        "rtd_loss": loss,
        "rtd_accuracy": weighted_mean((predicted == actual).astype(jnp.float32), mask),
        "rtd_precision": true_positives / jnp.maximum(jnp.sum(predicted), 1.0),
        "rtd_recall": true_positives / jnp.maximum(jnp.sum(actual), 1.0),
    }


def replaced_token_detection(generator_logits, discriminator_logits, batch, rng, weight: float):
    """Generator MLM + weight * discriminator loss.

    generator_logits(batch) -> [B, P, V] at the masked positions; discriminator_logits(input_ids) -> [B, S].
    """
    gen_logits = generator_logits(batch)
    gen_loss, metrics = masked_lm(gen_logits, batch, prefix="generator")
    corrupted, labels = corrupt(batch, sample_tokens(gen_logits, rng))
    disc_loss, disc_metrics = discriminator_metrics(discriminator_logits(corrupted), labels, batch["input_mask"])
    return gen_loss + weight * disc_loss, {**metrics, **disc_metrics}
