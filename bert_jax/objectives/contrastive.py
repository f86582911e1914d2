"""InfoNCE with in-batch negatives: each query against every positive (and hard negative) of the global batch.

Under the mesh the batch is split over data x fsdp, and the score matrix is pinned to [this device's queries, every
candidate of the global batch]: XLA gathers the candidates' vectors (B x H floats, small) to every device, so a
query meets the whole global batch as negatives, not just its device's share, as PyTorch users get only with
hand-written all-gathers. The loss is therefore the same number on one device or on a pod slice.
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from bert_jax.sharding import constrain

SCORES = ("activation_batch", None)  # [queries, candidates]: rows split like the batch, candidates whole
MAX_LOGIT_SCALE = 100.0  # a learned 1/temperature is clipped here (CLIP's bound), so logits stay finite


def unit(vectors):
    return vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def info_nce(queries, positives, negatives=None, *, scale, symmetric: bool = False):
    """(loss, metrics) of [B, H] query, positive and optional hard-negative vectors, scored by cosine x `scale`
    (1/temperature). Query i's target is positive i among the B positives and B negatives; `symmetric` adds the
    positives' loss of finding their query among the B queries, and averages the two."""
    queries, positives = unit(queries), unit(positives)
    candidates = positives if negatives is None else jnp.concatenate([positives, unit(negatives)])
    targets = jnp.arange(queries.shape[0])
    scale = jnp.minimum(scale, MAX_LOGIT_SCALE)
    scores = constrain(queries @ candidates.T, SCORES) * scale
    loss = optax.softmax_cross_entropy_with_integer_labels(scores, targets).mean()
    metrics = {"query_loss": loss, "accuracy": (scores.argmax(-1) == targets).mean(), "logit_scale": scale}
    if symmetric:
        reverse = constrain(positives @ queries.T, SCORES) * scale
        metrics["positive_loss"] = optax.softmax_cross_entropy_with_integer_labels(reverse, targets).mean()
        loss = (loss + metrics["positive_loss"]) / 2
    return loss, {**metrics, "loss": loss}
