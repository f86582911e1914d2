"""Model FLOPs of a pretraining step, counted from the architecture (the numerator of MFU).

Counts the matrix multiplications a model needs (2 FLOPs per multiply-add), as MFU conventionally does
(PaLM, appendix B): QKV and output projections, feed-forward, attention scores and weighted values, the E -> H
projection, and the heads — the MLM head on the predicted positions only when the model gathers them. A training
step is 3x the forward pass (backward = 2x forward). Rematerialisation does not count: it is overhead, not model work.
"""
from __future__ import annotations

from bert_jax import families
from bert_jax.config_lib import generator_config
from bert_jax.modeling.transformer import has_embedding_projection


def attended_pairs(seq_length: int, half_window: int | None) -> int:
    """(query, key) pairs of one sequence's attention: all of them, or those within half_window of each other."""
    s = seq_length
    if half_window is None or half_window >= s - 1:
        return s * s
    return s * (2 * half_window + 1) - half_window * (half_window + 1)


def encoder_forward_flops(model, seq_length: int) -> int:
    """One sequence through the embedding projection and all layers (shared layers count every time they run); a
    local layer's attention counts only the pairs inside its window."""
    s, h, i = seq_length, model.hidden_size, model.intermediate_size
    family = families.of(model)
    projection = 2 * s * model.embedding_size * h if has_embedding_projection(model) else 0
    dense = model.num_hidden_layers * (2 * s * 4 * h * h + 2 * s * family.ffn_matrices * h * i)
    windows = [family.attention_half_window(model, layer) if family.attention_half_window else None
               for layer in range(model.num_hidden_layers)]
    return projection + dense + sum(2 * 2 * attended_pairs(s, window) * h for window in windows)


def mlm_head_forward_flops(model, positions: int) -> int:
    """Transform H -> E, then E -> V logits, at `positions` tokens."""
    # The real vocabulary: the padding columns (padded_vocab_size) are computed but, like remat, are not model work.
    return 2 * positions * (model.hidden_size * model.embedding_size + model.embedding_size * model.vocab_size)


def train_step_flops(config, gathered_mlm_head: bool = True) -> int:
    """Model FLOPs of one optimizer step over config.data.batch_size sequences of config.data.seq_length."""
    model, s = config.model, config.data.seq_length
    positions = config.masking.max_predictions_per_seq if gathered_mlm_head else s
    if config.objective == "rtd":
        gen = generator_config(model)
        forward = (encoder_forward_flops(gen, s) + mlm_head_forward_flops(gen, positions)
                   + encoder_forward_flops(model, s) + 2 * s * (model.hidden_size ** 2 + model.hidden_size))
    else:
        forward = encoder_forward_flops(model, s) + mlm_head_forward_flops(model, positions)
        if model.pooler:
            forward += 2 * model.hidden_size ** 2
    return 3 * forward * config.data.batch_size
