"""Two-way classification of a sentence pair: next-sentence prediction (BERT) or sentence order (ALBERT)."""
from __future__ import annotations

import jax.numpy as jnp
import optax

# The batch key holding each objective's label: 1 = B is random text (NSP) / A and B are swapped (SOP).
LABEL_KEYS = {"nsp": "next_sentence_labels", "sop": "sentence_order_labels"}


def sentence_pair(logits, batch, task: str):
    """logits [B, 2] -> (loss, {<task>_loss, <task>_accuracy}) for task "nsp" or "sop"."""
    labels = batch[LABEL_KEYS[task]]
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    accuracy = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
    return loss, {f"{task}_loss": loss, f"{task}_accuracy": accuracy}
