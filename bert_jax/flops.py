"""Model FLOPs of a pretraining step, counted from the architecture (the numerator of MFU).

Counts the matrix multiplications a model needs (2 FLOPs per multiply-add), as MFU conventionally does
(PaLM, appendix B): QKV and output projections, feed-forward, attention scores and weighted values, the E -> H
projection, and the heads — the MLM head on the predicted positions only when the model gathers them, and the last
layer's queries, output projection and FFN there alone too where the model computes it so
(transformer.last_layer_at_rows). A training step is 3x the forward pass (backward = 2x forward). Rematerialisation
and padding (of the vocabulary, of the last layer's rows on GPU) do not count: they are overhead, not model work.
"""
from __future__ import annotations

from bert_jax import families
from bert_jax.config_lib import generator_config
from bert_jax.modeling.transformer import has_embedding_projection, last_layer_at_rows


def attended_pairs(seq_length: int, half_window: int | None) -> int:
    """(query, key) pairs of one sequence's attention: all of them, or those within half_window of each other."""
    s = seq_length
    if half_window is None or half_window >= s - 1:
        return s * s
    return s * (2 * half_window + 1) - half_window * (half_window + 1)


def encoder_forward_flops(model, seq_length: int, read_rows: int | None = None) -> int:
    """One sequence through the embedding projection and all layers (shared layers count every time they run); a
    local layer's attention counts only the pairs inside its window. Given read_rows, the rows of the output that
    are read: the last layer at those alone, its keys and values over every row, where the model computes it so."""
    s, h, i = seq_length, model.hidden_size, model.intermediate_size
    family = families.of(model)
    projection = 2 * s * model.embedding_size * h if has_embedding_projection(model) else 0
    at_queries = 2 * 2 * h * h + 2 * family.ffn_matrices * h * i  # a query row's Q and output projections, and FFN
    dense = model.num_hidden_layers * s * (2 * 2 * h * h + at_queries)  # + every row's K and V
    windows = [family.attention_half_window(model, layer) if family.attention_half_window else None
               for layer in range(model.num_hidden_layers)]
    attention = sum(2 * 2 * attended_pairs(s, window) * h for window in windows)
    if read_rows is not None and last_layer_at_rows(model):  # a global last layer (the shared encoder's)
        dense -= (s - read_rows) * at_queries
        attention -= 2 * 2 * (s - read_rows) * s * h
    return projection + dense + attention


def mlm_head_forward_flops(model, positions: int) -> int:
    """Transform H -> E, then E -> V logits, at `positions` tokens."""
    # The real vocabulary: the padding columns (padded_vocab_size) are computed but, like remat, are not model work.
    return 2 * positions * (model.hidden_size * model.embedding_size + model.embedding_size * model.vocab_size)


def train_step_flops(config, gathered_mlm_head: bool = True) -> int:
    """Model FLOPs of one optimizer step over config.data.batch_size sequences of config.data.seq_length."""
    model, s = config.model, config.data.seq_length
    positions = config.masking.max_predictions_per_seq if gathered_mlm_head else s
    read = lambda encoder: positions + int(encoder.pooler) if gathered_mlm_head else None  # the pooler reads [CLS]
    if config.objective == "rtd":
        gen = generator_config(model)
        forward = (encoder_forward_flops(gen, s, read(gen)) + mlm_head_forward_flops(gen, positions)
                   + encoder_forward_flops(model, s) + 2 * s * (model.hidden_size ** 2 + model.hidden_size))
    else:
        forward = encoder_forward_flops(model, s, read(model)) + mlm_head_forward_flops(model, positions)
        if model.pooler:
            forward += 2 * model.hidden_size ** 2
    return 3 * forward * config.data.batch_size
