"""Masked language modelling: cross-entropy over the masked positions only, weighted by masked_lm_weights."""
from __future__ import annotations

import jax.numpy as jnp
import optax


def weighted_mean(values, weights):
    """Mean over the real entries; padding has weight 0, and an all-padding batch gives 0 rather than NaN."""
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def masked_lm(logits, batch, prefix: str = "mlm"):
    """logits [B, P, V] at masked_lm_positions -> (loss, {<prefix>_loss, <prefix>_accuracy})."""
    labels = batch["masked_lm_ids"]
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels), weights)
    accuracy = weighted_mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32), weights)
    return loss, {f"{prefix}_loss": loss, f"{prefix}_accuracy": accuracy}
