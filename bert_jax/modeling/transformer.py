"""The encoder all four families share: embeddings, post-LN transformer layers (optionally shared), pooler.

Parameters carry logical axis names only; `bert_jax.sharding` maps them to mesh axes:
  vocab (V), token_embed (E, the embedding width), embed (H), mlp (FFN width), heads, kv (head width),
  positions, token_types, classes, and layers (the stacked axis of scanned layers).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import linen as nn

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}

Config = ml_collections.ConfigDict
Array = Any


def compute_dtype(config: Config) -> jnp.dtype:
    return jnp.dtype(config.dtype)


def normal_init(config: Config, axes: tuple[str, ...]):
    """BERT's N(0, initializer_range) initialisation, tagged with logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(stddev=config.initializer_range), axes)


def dense(config: Config, features, axes: tuple[str, ...], name: str, axis=-1) -> nn.DenseGeneral:
    """A Linear layer; `axes` names the kernel's dimensions, the bias takes the output ones."""
    num_outputs = len(features) if isinstance(features, tuple) else 1
    return nn.DenseGeneral(
        features,
        axis=axis,
        dtype=compute_dtype(config),
        param_dtype=jnp.float32,
        kernel_init=normal_init(config, axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[-num_outputs:]),
        name=name,
    )


def layer_norm(config: Config, axis_name: str, name: str) -> nn.LayerNorm:
    """LayerNorm computed the two-pass way, as PyTorch does, so outputs match the references to float32 rounding."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=compute_dtype(config),
        param_dtype=jnp.float32,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis_name,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis_name,)),
        name=name,
    )


def has_embedding_projection(config: Config) -> bool:
    """ALBERT always maps E -> H; ELECTRA (and anything else) only when the widths differ."""
    return config.family == "albert" or config.embedding_size != config.hidden_size


def position_ids_for(config: Config, input_ids: Array) -> Array:
    """0..S-1, except RoBERTa's fairseq numbering: pad_token_id + 1 onwards, padding kept at pad_token_id."""
    if config.family == "roberta":
        not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def attention_mask_for(attention_mask: Array, packing_segment_ids: Array | None) -> Array:
    """Boolean [B, 1, S, S]: a query sees the real keys of its own packed example (of the whole row if unpacked)."""
    mask = nn.make_attention_mask(jnp.ones_like(attention_mask), attention_mask > 0, dtype=jnp.bool_)
    if packing_segment_ids is not None:
        same_example = nn.make_attention_mask(packing_segment_ids, packing_segment_ids, jnp.equal, dtype=jnp.bool_)
        mask = jnp.logical_and(mask, same_example)
    return mask


class Embeddings(nn.Module):
    """Word + position + token-type embeddings of width E, then LayerNorm and dropout."""

    config: Config

    def setup(self):
        cfg = self.config
        embed = functools.partial(nn.Embed, dtype=compute_dtype(cfg), param_dtype=jnp.float32)
        self.word_embeddings = embed(cfg.vocab_size, cfg.embedding_size,
                                     embedding_init=normal_init(cfg, ("vocab", "token_embed")))
        self.position_embeddings = embed(cfg.max_position_embeddings, cfg.embedding_size,
                                         embedding_init=normal_init(cfg, ("positions", "token_embed")))
        self.token_type_embeddings = embed(cfg.type_vocab_size, cfg.embedding_size,
                                           embedding_init=normal_init(cfg, ("token_types", "token_embed")))
        self.norm = layer_norm(cfg, "token_embed", "norm")
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.norm(x), deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        """Logits against the word embeddings: the tied output projection of the MLM heads."""
        return self.word_embeddings.attend(x)


def dot_product_attention(query, key, value, mask, config: Config, dropout_rng=None):
    """softmax(QK^T/sqrt(d)) V over [B, S, heads, d]; JAX's fused kernels unless given a dropout rng."""
    if dropout_rng is not None:
        # jax.nn.dot_product_attention has no dropout; Flax's reference implementation does.
        return nn.dot_product_attention(query, key, value, mask=mask, dropout_rng=dropout_rng,
                                        dropout_rate=config.attention_probs_dropout_prob, deterministic=False,
                                        dtype=compute_dtype(config))
    implementation = None if config.attention_impl == "auto" else config.attention_impl
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation=implementation)


class TransformerLayer(nn.Module):
    """One post-LN layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)). Returns (x, None) so nn.scan can carry x."""

    config: Config
    deterministic: bool

    @nn.compact
    def __call__(self, x, mask):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        q, k, v = (dense(cfg, (heads, head_dim), ("embed", "heads", "kv"), name)(x)
                   for name in ("query", "key", "value"))
        dropout_rng = None
        if cfg.attention_probs_dropout_prob > 0.0 and not self.deterministic:
            dropout_rng = self.make_rng("dropout")
        context = dot_product_attention(q, k, v, mask, cfg, dropout_rng)
        attended = dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "attention_output", axis=(-2, -1))(context)
        dropout = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)
        x = layer_norm(cfg, "embed", "attention_norm")(x + dropout(attended))
        h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(ACTIVATIONS[cfg.hidden_act](h))
        x = layer_norm(cfg, "embed", "output_norm")(x + dropout(h))
        return x, None


def stacks_layers(config: Config) -> bool:
    """Whether the encoder keeps its layers stacked under `layers` (scan over unshared layers)."""
    return config.scan_layers and config.num_hidden_groups == config.num_hidden_layers


def _map_encoders(params: dict, fn) -> dict:
    """Apply fn to the parameters of every encoder in a parameter tree (ELECTRA has two)."""
    if not isinstance(params, dict):
        return params
    return {k: fn(v) if k == "encoder" else _map_encoders(v, fn) for k, v in params.items()}


def to_model_layout(params: dict, config: Config) -> dict:
    """Unscanned parameters (layer_0 ... layer_{L-1}, as conversions produce) in the layout `config` builds."""
    if not stacks_layers(config):
        return params

    def stack(encoder):
        layers = [encoder[f"layer_{i}"] for i in range(len(encoder))]
        return {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}

    return _map_encoders(params, stack)


def to_unscanned_layout(params: dict) -> dict:
    """The inverse of to_model_layout: stacked `layers` back to layer_0 ... layer_{L-1}."""

    def unstack(encoder):
        if "layers" not in encoder:
            return encoder
        count = jax.tree.leaves(encoder["layers"])[0].shape[0]
        return {f"layer_{i}": jax.tree.map(lambda x: x[i], encoder["layers"]) for i in range(count)}

    return _map_encoders(params, unstack)


class Encoder(nn.Module):
    """num_hidden_layers layers in num_hidden_groups weight groups: BERT has a group per layer, ALBERT one for all.

    Parameters are named layer_<group>; with scan_layers and one layer per group they are stacked under `layers`
    instead (leading axis = layer), which compiles the stack once.
    """

    config: Config

    @nn.compact
    def __call__(self, x, mask, deterministic: bool):
        cfg = self.config
        layer_cls = TransformerLayer
        if cfg.remat_policy != "none":
            layer_cls = nn.remat(TransformerLayer, policy=REMAT_POLICIES[cfg.remat_policy],
                                 prevent_cse=not cfg.scan_layers)
        groups = cfg.num_hidden_groups
        repeats = cfg.num_hidden_layers // groups
        if stacks_layers(cfg):
            stack = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                            in_axes=nn.broadcast, length=groups, metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = stack(cfg, deterministic, name="layers")(x, mask)
            return x
        for group in range(groups):
            if cfg.scan_layers:
                shared = nn.scan(layer_cls, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                                 in_axes=nn.broadcast, length=repeats)
                x, _ = shared(cfg, deterministic, name=f"layer_{group}")(x, mask)
            else:
                layer = layer_cls(cfg, deterministic, name=f"layer_{group}")
                for _ in range(repeats):
                    x, _ = layer(x, mask)
        return x


class EncoderModel(nn.Module):
    """The backbone every family keeps: embeddings -> (E -> H projection) -> encoder -> pooler.

    `shared_embeddings` lets ELECTRA's generator and discriminator use one Embeddings module owned by their parent.
    Returns {"last_hidden_state": [B, S, H], "pooler_output": [B, H] (when config.pooler)}.
    """

    config: Config
    shared_embeddings: Embeddings | None = None

    def setup(self):
        cfg = self.config
        if self.shared_embeddings is None:
            self.embeddings = Embeddings(cfg)
        if has_embedding_projection(cfg):
            self.embedding_projection = dense(cfg, cfg.hidden_size, ("token_embed", "embed"), "embedding_projection")
        self.encoder = Encoder(cfg)
        if cfg.pooler:
            self.pooler = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")

    def token_embeddings(self) -> Embeddings:
        return self.shared_embeddings if self.shared_embeddings is not None else self.embeddings

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                 packing_segment_ids=None, deterministic: bool = True):
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = position_ids_for(cfg, input_ids)
        x = self.token_embeddings()(input_ids, token_type_ids, position_ids, deterministic)
        if has_embedding_projection(cfg):
            x = self.embedding_projection(x)
        mask = attention_mask_for(attention_mask, packing_segment_ids)
        x = self.encoder(x, mask, deterministic)
        outputs = {"last_hidden_state": x}
        if cfg.pooler:
            outputs["pooler_output"] = jnp.tanh(self.pooler(x[:, 0]))
        return outputs
