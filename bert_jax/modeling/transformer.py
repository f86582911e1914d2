"""The encoder BERT, RoBERTa, ALBERT and ELECTRA share: embeddings, post-LN transformer layers (optionally shared),
pooler. (ModernBERT has its own, in bert_jax/families/modernbert.py.)

Parameters carry logical axis names only; `bert_jax.sharding` maps them to mesh axes:
  vocab (V), token_embed (E, the embedding width), embed (H), mlp (FFN width), heads, kv (head width),
  positions, token_types, classes, and layers (the stacked axis of scanned layers).
Activations are pinned at every layer boundary and inside attention and the FFN with names of their own
(activation_batch, activation_length, activation_embed, ...; see `bert_jax.sharding.constrain`), so that XLA keeps
the batch split over data x fsdp instead of choosing a layout from the parameters'. Outside
`sharding.activation_sharding` they are no-ops.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from bert_jax import families, sharding
from bert_jax.config_lib import ConfigError
from bert_jax.modeling import flash_attention, gpu_attention
from bert_jax.sharding import constrain


def gelu(x):
    """Exact GELU as PyTorch computes it, x/2 (1 + erf(x/sqrt 2)). jax.nn.gelu's erfc form lowers to an exp and a
    rational polynomial that XLA:CPU ran as two fusions (5% of BERT-base's step); erf is one HLO op."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype)))


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole layer in the backward pass
    # the matmuls' results, and cuDNN attention's, whose matmuls run inside its kernel (gpu_attention)
    "dots": jax.checkpoint_policies.save_from_both_policies(jax.checkpoint_policies.checkpoint_dots,
                                                            gpu_attention.saves_kernel_outputs),
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}
# What a scanned layer keeps for its backward pass without remat (checkpoint_name in TransformerLayer): Q, K and V, the
# attention LayerNorm's input and the FFN's pre-activation (the output LayerNorm's input is the loop's carry,
# PendingNorm); the rest (GELU, LayerNorm, dropout, and on TPU the attention kernel's forward, for its output and
# logsumexp) is recomputed in the backward pass. Left to scan's own autodiff, the loop stacked every intermediate of
# those besides, copying each into the stack at every iteration: BERT-base with 4 layers at 256 x 128 a chip on v5p-8
# (compiler's estimates) took 10.6 GB of temporaries and 31.7 ms, then 6.4 GB and 29.2 ms (unscanned: 4.6, 23.1;
# keeping the first LayerNorm's output too: 6.5 GB, 29.3 ms). Keeping the kernel's output as well cost a heads-first
# copy into its stack that took longer than running the kernel again: 12 layers, 13.8 GB and 79.9 ms with it, 12.8 GB
# and 79.2 ms without (unscanned: 12.8 GB, 61.9 ms; docs/tpu.md).
QKV = "attention_qkv"
LAYER_ACTIVATIONS = (QKV, "attention_sum", "intermediate")
# Each LayerNorm's mean and 1/sqrt(variance + eps), [B, S, 1] float32: kept too, the backward pass normalises the
# kept inputs again without reducing them. BERT-base s128 at 256 a chip, scanned (v5p-8, compiler's estimates): 61.2
# to 59.5 ms, 10.35 to 10.34 GB; BERT-large s512 at 72: 212 to 206 ms; the unscanned steps are the same programs.
LAYER_NORM_STATISTICS = ("layer_norm_mean", "layer_norm_inverse_std")
# On a GPU cuDNN's attention forward also keeps its output and softmax statistics, which have no names (gpu_attention).
# Before, a scanned layer there took scan's own autodiff, which stacked every intermediate: BERT-base at 256 x 128
# compiled for an H200 held 21.3 GB and read and wrote 140 GB a step in fusions; under this policy 8.9 GB and 78 GB.
SCANNED_SAVES = jax.checkpoint_policies.save_from_both_policies(
    jax.checkpoint_policies.save_only_these_names(*LAYER_ACTIVATIONS, *LAYER_NORM_STATISTICS),
    gpu_attention.saves_kernel_outputs)

Config = ml_collections.ConfigDict
Array = Any


def compute_dtype(config: Config) -> jnp.dtype:
    return jnp.dtype(config.dtype)


def attention_head_width(config: Config) -> int:
    """d, the width of one attention head."""
    return config.hidden_size // config.num_attention_heads


def param_dtype(config: Config) -> jnp.dtype:
    """The stored parameters' dtype (float32 master weights by default); layers cast them to compute_dtype."""
    return jnp.dtype(config.param_dtype)


HIDDEN = ("activation_batch", "activation_length", "activation_embed")  # [B, S, H] between layers (also E-wide)
PER_HEAD = ("activation_batch", "activation_heads_length", "activation_heads", "activation_kv")  # [B, S, heads, d]
LANES = PER_HEAD[:3]  # [B, S, heads x d]: a token's heads side by side, as the projections lay them out
STACKED_LANES = (None, *LANES)  # Q, K and V stacked: [3, B, S, heads x d]
FFN_HIDDEN = ("activation_batch", "activation_heads_length", "activation_mlp")  # [B, S, FFN width]
POOLED = ("activation_batch", "activation_embed")  # [B, H]: [CLS] vectors, the sentence heads' inputs
ROWS = ("activation_batch", None, "activation_embed")  # [B, P, H] at a few positions (OutputRows), or all S


def normal_init(config: Config, axes: tuple[str, ...]):
    """BERT's N(0, initializer_range) initialisation, tagged with logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(stddev=config.initializer_range), axes)


def dense(config: Config, features: int, axes: tuple[str, str], name: str) -> Dense:
    """A Linear layer; `axes` names the kernel's dimensions, the bias takes the output one."""
    return Dense(features, axes, compute_dtype(config), param_dtype(config), normal_init(config, axes), name=name)


class Dense(nn.Module):
    """x @ kernel + bias over x's last axis (nn.Dense's parameters, initialised alike), by linear_dot_general and
    add_bias."""

    features: int
    axes: tuple[str, str]
    dtype: jnp.dtype
    param_dtype: jnp.dtype
    kernel_init: Any

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.axes[-1:]),
                          (self.features,), self.param_dtype)
        out = linear_dot_general()(x.astype(self.dtype), kernel.astype(self.dtype), (((x.ndim - 1,), (0,)), ((), ())))
        return add_bias(out, bias.astype(self.dtype))


def add_bias(x, bias):
    """x + bias, bias broadcast over x's leading axes; on CPU a bfloat16 bias's gradient sums in float32 there
    (float32_summed_bias)."""
    if sharding.target_platform() == "cpu" and bias.dtype == jnp.bfloat16:
        return float32_summed_bias(x, bias.reshape((1,) * (x.ndim - bias.ndim) + bias.shape))
    return x + bias


@jax.custom_vjp
def float32_summed_bias(x, bias):
    """x + bias (of x's rank), whose bias gradient sums the output gradient in float32 over the broadcast axes.

    Autodiff's sum of a bfloat16 gradient reaches XLA:CPU as a bfloat16 reduction, which it converts to float32 in
    a pass of its own and sums in a reduce-window: 11 ms for one FFN bias of BERT-base at 8 x 128 tokens, where the
    float32 sum of the same gradient takes 0.4 ms in XLA:CPU's reduction kernel.
    """
    return x + bias


def _float32_summed_bias_forward(x, bias):
    return x + bias, bias


def _float32_summed_bias_backward(bias, grad):
    broadcast = tuple(axis for axis, size in enumerate(bias.shape) if size == 1 and grad.shape[axis] != 1)
    return grad, jnp.sum(grad, broadcast, dtype=jnp.float32, keepdims=True).astype(bias.dtype)


float32_summed_bias.defvjp(_float32_summed_bias_forward, _float32_summed_bias_backward)


def linear_dot_general():
    """The dot_general of a Linear layer on the platform being traced: rows_dot_general on CPU."""
    return rows_dot_general if sharding.target_platform() == "cpu" else jax.lax.dot_general


def rows_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """lax.dot_general of a Linear layer with the input's leading axes merged ([B, S, H] -> [B*S, H]), for XLA:CPU.

    The weight gradient then contracts one axis, not B and S: given two, XLA:CPU first copied the output gradient
    transposed, with the dropout and LayerNorm backward fused into that strided copy (7% of BERT-base's step).
    bfloat16 operands go to bfloat16_matmul. Other shapes, and other platforms (a merged axis would hide the batch's
    sharding), use lax.dot_general as it is.
    """
    (lhs_contracting, rhs_contracting), batch = dimension_numbers
    contracted = len(lhs_contracting)
    rows = lhs.ndim - contracted
    if (any(batch[0]) or tuple(lhs_contracting) != tuple(range(rows, lhs.ndim))
            or tuple(rhs_contracting) != tuple(range(contracted)) or rows < 2):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type)
    width = int(np.prod(lhs.shape[rows:]))
    if lhs.dtype == rhs.dtype == jnp.bfloat16 and preferred_element_type in (None, jnp.bfloat16):
        out = bfloat16_matmul(lhs.reshape(-1, width), rhs.reshape(width, -1))
    else:  # the kernel's output axes stay apart, and so does their sharding (Q, K, V's [3, heads x d])
        out = jax.lax.dot_general(lhs.reshape(-1, width), rhs.reshape(width, *rhs.shape[contracted:]),
                                  (((1,), (0,)), ((), ())), precision=precision,
                                  preferred_element_type=preferred_element_type)
    return out.reshape(lhs.shape[:rows] + rhs.shape[contracted:])


def float32_sums(lhs, rhs, contracting, dtype):
    """lax.dot_general of bfloat16 matrices asked for float32 sums, rounded to `dtype` after."""
    out = jax.lax.dot_general(lhs, rhs, (contracting, ((), ())), preferred_element_type=jnp.float32)
    return out.astype(dtype)


@jax.custom_vjp
def bfloat16_matmul(lhs, rhs):
    """lhs @ rhs of bfloat16 [N, K] x [K, M] to bfloat16, each of its matmuls (the backward's too) asking for float32
    sums with the lhs's contracted axis last, so that XLA:CPU runs them in its bfloat16 kernel (AMX where the CPU
    has it). Any other bfloat16 dot it runs in its float32 kernel, the operands converted first. One core of an Intel
    Xeon with AMX, [1024, 768] x [768, 3072]: 930 against 162 GFLOP/s; the weight gradient, from its transposed copy,
    3.4 against 17.4 ms on two cores. The rounding is as before, float32 sums rounded once to bfloat16, in another
    order (483 of those 3.1M outputs round the other way; the same error against float64). Matrices only: a bfloat16
    dot with float32 sums over more axes reaches XLA:CPU's fallback kernel, which refuses it ("Unsupported element
    type for DotThunk").
    """
    return float32_sums(lhs, rhs, ((1,), (0,)), jnp.bfloat16)


def _bfloat16_matmul_forward(lhs, rhs):
    return bfloat16_matmul(lhs, rhs), (lhs, rhs)


def _bfloat16_matmul_backward(operands, grad):
    lhs, rhs = operands
    return (float32_sums(grad, rhs, ((1,), (1,)), lhs.dtype),
            float32_sums(transposed_copy(lhs), grad, ((1,), (0,)), rhs.dtype))


bfloat16_matmul.defvjp(_bfloat16_matmul_forward, _bfloat16_matmul_backward)


def transposed_copy(matrix):
    """matrix.T written out row by row. Given matrix.T itself, XLA folds the transpose into the dot that reads it, as
    a transposed operand, which XLA:CPU's bfloat16 kernel does not take: a flat array has one layout only."""
    return jax.lax.optimization_barrier(matrix.T.reshape(-1)).reshape(matrix.shape[::-1])


def normalize(x, scale, bias, epsilon: float, dtype):
    """LayerNorm's arithmetic (Flax's nn.LayerNorm with use_fast_variance=False), with the float32 statistics named
    (LAYER_NORM_STATISTICS), so that a scanned layer keeps them for its backward pass instead of reducing its
    LayerNorms' inputs again (SCANNED_SAVES).

    Two-pass, as PyTorch computes it, so outputs match the references to float32 rounding. Under bfloat16 the
    statistics and the normalisation stay float32 and only the result is cast back: a bf16 variance over 1024
    features would lose most of its digits.
    """
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = checkpoint_name(wide.mean(-1, keepdims=True), LAYER_NORM_STATISTICS[0])
    inverse_std = checkpoint_name(jax.lax.rsqrt(jnp.square(wide - mean).mean(-1, keepdims=True) + epsilon),
                                  LAYER_NORM_STATISTICS[1])
    return ((x - mean) * (inverse_std * scale) + bias).astype(dtype)


class LayerNorm(nn.Module):
    """Flax's nn.LayerNorm (its parameters and names) over `normalize`; `weights()` hands its parameters to a
    LayerNorm applied elsewhere (TransformerLayer's deferred output LayerNorm)."""

    features: int
    epsilon: float
    dtype: Any
    param_dtype: Any
    axis_name: str

    def setup(self):
        init = lambda fn: nn.with_logical_partitioning(fn, (self.axis_name,))
        self.scale = self.param("scale", init(nn.initializers.ones), (self.features,), self.param_dtype)
        self.bias = self.param("bias", init(nn.initializers.zeros), (self.features,), self.param_dtype)

    def __call__(self, x):
        return normalize(x, self.scale, self.bias, self.epsilon, self.dtype)

    def weights(self) -> tuple[Array, Array]:
        return self.scale, self.bias


def layer_norm(config: Config, axis_name: str, name: str) -> LayerNorm:
    """A LayerNorm over the embedding width (axis token_embed) or the hidden width (embed)."""
    features = config.embedding_size if axis_name == "token_embed" else config.hidden_size
    return LayerNorm(features, config.layer_norm_eps, compute_dtype(config), param_dtype(config), axis_name, name=name)


def has_embedding_projection(config: Config) -> bool:
    """ALBERT always maps E -> H; the others only when the widths differ (ELECTRA's small models)."""
    return families.of(config).always_projects_embeddings or config.embedding_size != config.hidden_size


def position_ids_for(config: Config, input_ids: Array) -> Array:
    """0..S-1, except with fairseq's numbering (RoBERTa): pad_token_id + 1 onwards, padding kept at pad_token_id."""
    if families.of(config).position_offset:
        not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def attention_mask_for(attention_mask: Array, packing_segment_ids: Array | None,
                       query_positions: Array | None = None) -> Array:
    """Boolean [B, 1, S, S]: a query sees the real keys of its own packed example (of the whole row if unpacked).
    With query_positions [B, P], the rows of the queries at those positions only: [B, 1, P, S]."""
    queries = jnp.ones_like(attention_mask if query_positions is None else query_positions)
    mask = nn.make_attention_mask(queries, attention_mask > 0, dtype=jnp.bool_)
    if packing_segment_ids is not None:
        query_ids = packing_segment_ids if query_positions is None else jnp.take_along_axis(
            packing_segment_ids, query_positions, axis=1)
        same_example = nn.make_attention_mask(query_ids, packing_segment_ids, jnp.equal, dtype=jnp.bool_)
        mask = jnp.logical_and(mask, same_example)
    return mask


def gather_positions(hidden: Array, positions: Array) -> Array:
    """hidden[b, positions[b, p]]: [B, S, H] x [B, P] -> [B, P, H]."""
    return jnp.take_along_axis(hidden, positions[..., None], axis=1)


# 128 rows a tile, times 3: the vocabulary then splits over every tensor size that divides 2^7 x 3, which holds
# every preset's head counts and their divisors (BERT-base's 12 heads: tensor 3, 6 and 12 too). One multiple for
# every config, so that ELECTRA's generator and discriminator always agree on the table they share.
VOCAB_MULTIPLE = 384
# The parameters with a vocabulary axis (always their first), as (module, parameter) at the end of their path.
VOCAB_PARAMS = (("word_embeddings", "embedding"), ("mlm_head", "bias"), ("generator_head", "bias"))


def padded_vocab_size(config: Config) -> int:
    """Rows of the word-embedding table and the MLM bias: vocab_size rounded up to a multiple of VOCAB_MULTIPLE,
    so that the vocabulary axis splits evenly over the tensor mesh axis (30522 -> 30720).

    config.vocab_size stays the real vocabulary. Rows past it are padding: never an input id, never predicted
    (MlmHead gives their logits MASKED_LOGIT), never exported (state_dict slices them off, and pads on import),
    never counted (count_params)."""
    return -(-config.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def map_vocab_params(params, fn):
    """fn applied to every parameter of VOCAB_PARAMS in a plain pytree (arrays, ShapeDtypeStructs, metadata)."""
    def apply(path, leaf):
        names = tuple(getattr(k, "key", getattr(k, "name", None)) for k in path[-2:])
        return fn(leaf) if names in VOCAB_PARAMS else leaf

    return jax.tree_util.tree_map_with_path(apply, params)


def pad_vocab(params, config: Config):
    """Vocabulary parameters with fewer rows than padded_vocab_size (HF and TF1 files with exactly vocab_size, or
    workdirs saved under an earlier padding) grown with zero rows to it, as numpy; any other leaf unchanged."""
    rows = padded_vocab_size(config)

    def pad(x):
        if not config.vocab_size <= x.shape[0] < rows:
            return x
        return np.pad(np.asarray(x), [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1))

    return map_vocab_params(params, pad)


def unpad_vocab(params, config: Config):
    """The first vocab_size rows of every vocabulary parameter: what exports write."""
    return map_vocab_params(params, lambda x: x[:config.vocab_size])


def word_table_init(config: Config):
    """normal_init for the real rows, zeros for the padding: zero rows add nothing to the table's norm (LAMB's trust
    ratio) or to weight decay, get no gradient, and so stay zero, as after an import or an unpadded checkpoint."""
    normal = nn.initializers.normal(stddev=config.initializer_range)

    def init(key, shape, dtype=jnp.float32):
        return normal(key, shape, dtype).at[config.vocab_size:].set(0)

    return nn.with_logical_partitioning(init, ("vocab", "token_embed"))


ONE_HOT_ROWS = 1024  # tables up to this size (token types, learned positions) are looked up by a one-hot matmul


def lookup(table: nn.Embed, ids: Array, rows: str | None = None) -> Array:
    """table[ids], with the table gathered whole along its width first (FSDP gathers parameters before use) and
    its rows split over `rows`: left to itself XLA looks up the whole batch in the width-split table instead.

    Small tables are read by a one-hot matmul, as the original BERT reads its token types: a gather's gradient is a
    scatter-add, which on an H200 in bfloat16 serializes on the few rows that all B x S tokens add into (the 2-row
    token-type table took 33 of BERT-base's 122 ms step; benchmarks/RESULTS.md, "Device check"), and which sums
    them in bfloat16. The matmul's gradient sums in float32 at a fraction of a percent of the step's FLOPs. The word
    table keeps the gather: its rows get few updates each, and a one-hot over 30k rows would cost more than a layer.
    """
    embedding = constrain(table.embedding, (rows, "activation_embed")).astype(table.dtype)
    if embedding.shape[0] <= ONE_HOT_ROWS:
        one_hot = jax.nn.one_hot(ids, embedding.shape[0], dtype=embedding.dtype)
        return jnp.dot(one_hot, embedding, precision=jax.lax.Precision.HIGHEST)  # exact rows, also in float32
    return jnp.take(embedding, ids, axis=0)


class Embeddings(nn.Module):
    """Word + position + token-type embeddings of width E, then LayerNorm and dropout.

    The word table has padded_vocab_size(config) rows, so that it splits evenly over the tensor mesh axis."""

    config: Config

    def setup(self):
        cfg = self.config
        embed = functools.partial(nn.Embed, dtype=compute_dtype(cfg), param_dtype=param_dtype(cfg))
        self.word_embeddings = embed(padded_vocab_size(cfg), cfg.embedding_size, embedding_init=word_table_init(cfg))
        self.position_embeddings = embed(cfg.max_position_embeddings, cfg.embedding_size,
                                         embedding_init=normal_init(cfg, ("positions", "token_embed")))
        self.token_type_embeddings = embed(cfg.type_vocab_size, cfg.embedding_size,
                                           embedding_init=normal_init(cfg, ("token_types", "token_embed")))
        self.norm = layer_norm(cfg, "token_embed", "norm")
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
        x = lookup(self.word_embeddings, input_ids, "activation_vocab") + lookup(self.token_type_embeddings,
                                                                                  token_type_ids)
        x = constrain(x + lookup(self.position_embeddings, position_ids), HIDDEN)
        return self.dropout(self.norm(x), deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        """Logits against the (padded) word embeddings, padding columns unmasked; MlmHead is what masks them."""
        return self.word_embeddings.attend(x)


SPLASH_BLOCKS = (512, 256, 128)  # splash attention's tiles on TPU (the lane width is 128), largest that divides S


def attention_kernel(config: Config, deterministic: bool, seq_length: int | None = None) -> str:
    """Which attention runs: "reference" (Flax's, which materialises the [B, heads, S, S] probabilities), a fused
    jax.nn.dot_product_attention implementation ("xla", "cudnn"; "auto": XLA's), or "splash" (flash attention for TPU
    in Pallas; interpreted, slowly, elsewhere): bert_jax's own flash kernel, which also drops the probabilities
    inside the kernel (bert_jax.modeling.flash_attention), or Pallas' splash for ModernBERT (tpu_kernel).

    "auto" is splash when the step is traced for TPU (sharding.target_platform) and S is a multiple of its 128-token
    tiles (which the kernel needs on any platform); on a GPU it is cuDNN's flash attention where the dtype and head
    width allow (gpu_attention.auto_kernel; packed rows and local windows then still run XLA's, see there).
    Elsewhere the fused kernels have no dropout on the probabilities, so "auto" trains with the reference whenever
    attention_probs_dropout_prob > 0 (the paper presets) and is fused only without it, and for evaluation and
    inference; on CPU off a mesh that is cpu_attention. Naming "xla" or "cudnn" while training with attention dropout
    is an error rather than a silent fallback.
    docs/training.md ("Attention kernels and dropout") measures what dropping attention dropout costs.
    """
    dropout = not deterministic and config.attention_probs_dropout_prob > 0.0
    if config.attention_impl == "reference":
        return "reference"
    tiles = seq_length is None or seq_length % SPLASH_BLOCKS[-1] == 0
    if config.attention_impl == "auto" and tiles and sharding.target_platform() == "tpu":
        return "splash"
    if dropout and config.attention_impl == "auto":
        return "reference"
    if dropout and config.attention_impl != "splash":
        raise ConfigError(f"config.model.attention_impl={config.attention_impl!r}: this fused kernel has no attention "
                          "dropout; set config.model.attention_probs_dropout_prob=0.0, or attention_impl='auto' "
                          "or 'splash' (TPU)")
    if config.attention_impl == "auto" and sharding.target_platform() == "gpu":
        return gpu_attention.auto_kernel(config)
    if config.attention_impl == "splash" and not tiles:
        raise ConfigError(f"config.model.attention_impl='splash': the sequence length {seq_length} must be a multiple "
                          f"of {SPLASH_BLOCKS[-1]}; pad the batches (config.data.seq_length) or use 'auto'")
    return config.attention_impl


def layer_mask(config: Config, attention_mask: Array, packing_segment_ids: Array | None,
               deterministic: bool) -> Array:
    """What every layer's attention takes: [B, S] segment ids for splash, int32 [B] key lengths for cuDNN on unpacked
    rows (no [B, S, S] array at all for either), else the boolean [B, 1, S, S] mask of attention_mask_for."""
    kernel = attention_kernel(config, deterministic, attention_mask.shape[1])
    if kernel == "splash":
        return segment_ids_for(attention_mask, packing_segment_ids)
    if kernel == "cudnn" and packing_segment_ids is None:
        return gpu_attention.key_lengths(attention_mask)
    if kernel == "cudnn" and config.attention_impl == "auto":
        gpu_attention.log_packed_fallback()
    return attention_mask_for(attention_mask, packing_segment_ids)


def segment_ids_for(attention_mask: Array, packing_segment_ids: Array | None) -> Array:
    """int32 [B, S] for splash, where a query sees exactly the keys of its own id: the packed example's id (0 when
    unpacked) on real tokens, -1 on padding. A real query sees what attention_mask_for lets it see; a padding query
    sees the padding only (the reference lets it see real keys), which no output of a real token depends on."""
    example = jnp.zeros_like(attention_mask) if packing_segment_ids is None else packing_segment_ids
    return jnp.where(attention_mask > 0, example, -1).astype(jnp.int32)


def window_mask(mask: Array, half_window: int) -> Array:
    """`mask` [B, 1, S, S] also limited to keys within half_window positions of the query."""
    index = jnp.arange(mask.shape[-1])
    near = jnp.abs(index[:, None] - index[None, :]) <= half_window
    return jnp.logical_and(mask, near)


def dot_product_attention(qkv, mask, config: Config, dropout_rng=None, half_window: int | None = None,
                          scaled_query: bool = False):
    """softmax(QK^T/sqrt(d)) V for Q, K and V stacked [3, B, S, heads x d] as one projection writes them
    (query_key_value; bert_jax's TPU kernel reads it so) or as three [B, S, heads, d] arrays, with attention dropout
    when given a dropout rng. `mask` is what layer_mask made, `half_window` limits each query to keys that near
    (ModernBERT's local layers). `scaled_query`: the query is already multiplied by 1/sqrt(d) (query_key_value's
    scale_query), which only splash takes.

    The context comes back as its kernel writes it: [B, S, heads x d] from bert_jax's TPU kernel on stacked Q, K
    and V, else [B, S, heads, d] (output_projection takes either). Reshaped for the output projection, it would be
    an array of its own that the backward pass keeps beside the kernel's (XLA:GPU's scanned step stacked both).

    Every path takes the logits and the softmax in float32 and multiplies bf16 probabilities into V under bfloat16.
    """
    stacked = not isinstance(qkv, (tuple, list))
    width = attention_head_width(config)
    kernel = attention_kernel(config, deterministic=dropout_rng is None, seq_length=qkv[0].shape[1])
    if kernel == "splash":
        rate = config.attention_probs_dropout_prob if dropout_rng is not None else 0.0
        return splash_attention(qkv, mask, width, half_window, dropout_rng, rate, scaled_query)
    if scaled_query:
        raise ValueError(f"a query scaled in advance is for splash only, not the {kernel!r} attention")
    query, key, value = (per_head(x, width) for x in qkv) if stacked else qkv
    return attention_per_head(query, key, value, mask, config, kernel, dropout_rng, half_window)


def per_head(x: Array, head_width: int) -> Array:
    """[..., heads x d] -> [..., heads, d]."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // head_width, head_width)


def in_lanes(x: Array) -> Array:
    """[..., heads, d] -> [..., heads x d]."""
    return x.reshape(*x.shape[:-2], -1)


def attention_per_head(query, key, value, mask, config: Config, kernel: str, dropout_rng=None,
                       half_window: int | None = None):
    """dot_product_attention's paths other than splash, over [B, S, heads, d]."""
    if kernel == "cudnn" and mask.ndim == 1:  # key lengths (layer_mask)
        return gpu_attention.attend(query, key, value, mask, half_window)
    if half_window is not None:
        mask = window_mask(mask, half_window)
    if kernel == "auto" and sharding.target_platform() == "cpu" and sharding.active_spec(PER_HEAD) is None:
        return cpu_attention(query, key, value, mask)
    if kernel != "reference":
        implementation = None if config.attention_impl == "auto" else kernel  # auto's cuDNN on packed rows: XLA's
        return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation=implementation)
    weights = nn.dot_product_attention_weights(
        query, key, mask=mask, dropout_rng=dropout_rng, dropout_rate=config.attention_probs_dropout_prob,
        deterministic=dropout_rng is None, dtype=compute_dtype(config), force_fp32_for_softmax=True,
        einsum=functools.partial(jnp.einsum, preferred_element_type=jnp.float32))
    return jnp.einsum("...hqk,...khd->...qhd", weights.astype(value.dtype), value)


CPU_ATTENTION_BYTES = 8 << 20  # the float32 logits a step of cpu_attention's loop makes: about what the caches hold


def cpu_attention(query, key, value, mask):
    """XLA:CPU's attention heads first, and over long rows a few examples at a time: over a whole batch the
    [B, heads, S, S] logits outgrow the caches (100 MB at MiniLM's 32 x 256). Off a mesh only: the loop runs over the
    batch axis, which a mesh splits. The same math as the other paths, float32 logits and softmax."""
    def attend(q, k, v, m):  # one example: q, k, v [S, heads, d], m [1, S, S]
        q, k, v = (jnp.swapaxes(x, 0, 1) for x in (q, k, v))
        logits = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
        probabilities = jax.nn.softmax(jnp.where(m, logits, jnp.finfo(jnp.float32).min), axis=-1)
        return jnp.swapaxes(jnp.einsum("hqk,hkd->hqd", probabilities.astype(v.dtype), v), 0, 1)

    batch, length, heads, _ = query.shape
    examples = max(1, CPU_ATTENTION_BYTES // (heads * length * length * 4))
    if examples >= batch:
        return jax.vmap(attend)(query, key, value, mask)
    return jax.lax.map(lambda example: attend(*example), (query, key, value, mask), batch_size=examples)


def splash_block(seq_length: int, half_window: int | None = None) -> int:
    """splash's q and kv tile: the largest of SPLASH_BLOCKS that divides S (attention_kernel checked that one does);
    under a local window the smallest, so that fewer of the pairs a tile computes fall outside the window."""
    fitting = [b for b in SPLASH_BLOCKS if seq_length % b == 0]
    return fitting[0] if half_window is None else fitting[-1]


def splash_tiles(seq_length: int, half_window: int | None) -> int:
    """(q tile, kv tile) pairs the kernel computes for one example and head: all of them, or those a window of
    half_window reaches (the others are skipped)."""
    block = splash_block(seq_length, half_window)
    count = seq_length // block
    if half_window is None:
        return count * count
    starts = np.arange(count) * block
    ends = starts + block - 1
    reach = (starts[None, :] <= ends[:, None] + half_window) & (ends[None, :] >= starts[:, None] - half_window)
    return int(reach.sum())


def splash_fused_backward(seq_length: int, half_window: int | None) -> bool:
    """Whether splash_kernel fuses the backward pass: only over a single kv tile (see there)."""
    return splash_block(seq_length, half_window) == seq_length


def splash_kernel(seq_length: int, heads: int, half_window: int | None, interpret: bool):
    """The splash kernel for one example's [heads, S, d]: block-sparse over a local window (only the tiles that
    touch it run), or over all of S.

    The fused backward kernel (dq, dk and dv in one pass) writes a partial dq for every kv tile and sums them outside
    the kernel: at one kv tile that is free, but at ModernBERT's 8192 tokens the sum of 16 to 64 partials took 60% of
    the step's compiled cycles (XLA:TPU's estimate) and half its memory. So it is fused only over a single kv tile;
    otherwise a separate dq kernel recomputes the tiles' logits (3 matmuls a tile; dk and dv take 4, the fused
    kernel 5 for all three).
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape = (seq_length, seq_length)
    mask = splash.FullMask(shape) if half_window is None else splash.LocalMask(shape, (half_window, half_window), 0)
    block = splash_block(seq_length, half_window)
    fused = splash_fused_backward(seq_length, half_window)
    dq_blocks = {} if fused else dict(block_q_dq=block, block_kv_dq=block)
    blocks = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                               block_kv_dkv=block, block_kv_dkv_compute=block, use_fused_bwd_kernel=fused,
                               **dq_blocks)
    return splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=blocks, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


def logit_scale(head_dim: int) -> float:
    """1/sqrt(d), the scale of the attention logits, for the kernels that take it on the query: one definition, so
    that a query scaled in its projection (query_key_value) and one scaled in splash_attention round alike."""
    return 1.0 / float(np.sqrt(head_dim))


def with_query_scaled(qkv: Array, head_width: int) -> Array:
    """Stacked [3, ...] Q, K and V with Q multiplied by 1/sqrt(d) (logit_scale), for the TPU kernels, which do not
    scale the logits: one multiply by (1/sqrt(d), 1, 1), which fuses into its producer."""
    scale = jnp.array([logit_scale(head_width), 1.0, 1.0], qkv.dtype)
    return qkv * scale.reshape(3, *[1] * (qkv.ndim - 1))


def tpu_kernel(half_window: int | None, dropout: bool, stacked: bool = True) -> str:
    """Which Pallas kernel attention_impl="splash" runs: bert_jax's flash kernel (flash_attention) with attention
    dropout, which splash lacks, and over global attention on a stacked QKV array, which the compiler schedules 3.3x
    faster than splash at 128 tokens (BERT-base, 256 rows a chip: 0.42 against 1.39 ms a layer), 1.40x at 512
    (BERT-large, 72 rows) and as fast at 8192. Pallas' splash over a local window, where its block-sparse kernels
    are 1.36x faster than ours (ModernBERT-base at 8192 tokens: 28.2 against 38.4 ms a layer), and over three
    arrays (ModernBERT's, whose RoPE rotates Q and K apart from V): stacking them for bert_jax's kernel took its
    base s1024 step from 562 to 617 ms. Figures from benchmarks/attention_cycles.py and compile_check on v5p
    (docs/tpu.md, "Splash attention")."""
    return "flash" if dropout or (half_window is None and stacked) else "splash"


def splash_attention(qkv, segment_ids, head_width: int, half_window: int | None, dropout_rng=None, rate: float = 0.0,
                     scaled_query: bool = False):
    """Flash attention for TPU over Q, K and V of `head_width` in either of dot_product_attention's layouts, with
    [B, S] segment ids (segment_ids_for), in the kernel tpu_kernel picks: bert_jax's flash kernel, which drops the
    probabilities itself with a dropout rng and rate > 0, or Pallas' splash. The kernels do not scale the logits:
    the query is multiplied by 1/sqrt(d) here, or already was (`scaled_query`).

    bert_jax's kernel reads Q, K and V as the stacked projection writes them, [3, B, S, heads x d], and writes the
    context so, [B, S, heads x d], for the output projection: nothing is transposed or copied on the way, and in
    memory a 64-wide head fills half a 128-lane row instead of a padded row of its own. Splash takes Q, K and V
    heads first, as three arrays (a copy of each), and gives [B, S, heads, d] back, as does bert_jax's kernel for
    three arrays (ModernBERT's, whose output projection takes that).

    A Pallas kernel is opaque to XLA's partitioner, so under a mesh it runs inside shard_map on each device's batch
    rows and heads (the layout LANES or PER_HEAD pins); outside one, on the whole arrays. bert_jax's kernel is told
    which global rows and heads a device holds, so that its mask does not depend on the mesh.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    interpret = sharding.target_platform() != "tpu"
    stacked = not isinstance(qkv, (tuple, list))
    spec = sharding.active_spec(LANES if stacked else PER_HEAD)
    dropout = dropout_rng is not None and rate > 0.0
    flash = tpu_kernel(half_window, dropout, stacked) == "flash"

    def attend(qkv, ids, seed):
        if flash:
            qkv = qkv if stacked else jnp.stack([in_lanes(x) for x in qkv])
            qkv = qkv if scaled_query else with_query_scaled(qkv, head_width)
            heads = qkv.shape[-1] // head_width
            rows, first_head = (shard_offset(spec, axis, x) for axis, x in ((0, qkv.shape[1]), (2, heads)))
            context = flash_attention.flash_attention(qkv, ids, seed, rate, heads, half_window, rows, first_head,
                                                      interpret)
            return context if stacked else per_head(context, head_width)
        q, k, v = (per_head(x, head_width) for x in qkv) if stacked else qkv
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q if scaled_query else q * logit_scale(head_width), k, v))
        kernel = splash_kernel(q.shape[2], q.shape[1], half_window, interpret)
        per_example = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(ids, ids))
        return jnp.swapaxes(jax.vmap(per_example)(q, k, v, ids), 1, 2)

    seed = flash_attention.seed_from(dropout_rng) if dropout else jnp.zeros((), jnp.uint32)
    if spec is None:
        return attend(qkv, segment_ids, seed)
    ids_spec = jax.sharding.PartitionSpec(spec[0], None)
    qkv_spec = jax.sharding.PartitionSpec(None, *spec) if stacked else (spec,) * 3
    return jax.shard_map(attend, mesh=jax.sharding.get_abstract_mesh(),
                         in_specs=(qkv_spec, ids_spec, jax.sharding.PartitionSpec()),
                         out_specs=sharding.active_spec(LANES if flash and stacked else PER_HEAD),
                         check_vma=False)(qkv if stacked else tuple(qkv), segment_ids, seed)


def shard_offset(spec, axis: int, local_size: int):
    """Inside shard_map: the global index of this device's first element along `axis` of an array laid out by
    `spec` (0 outside a mesh, spec None): its position among the mesh axes that split that axis, major first."""
    axes = () if spec is None or spec[axis] is None else spec[axis]
    axes = (axes,) if isinstance(axes, str) else axes
    position = 0
    for name in axes:
        position = position * jax.lax.axis_size(name) + jax.lax.axis_index(name)
    return position * local_size


class ProjectionWeights(nn.Module):
    """Kernel and bias of one of attention's projections between H and [heads, d], by the logical names of their
    axes ("embed", "heads", "kv"), initialised and named as `dense` would make them (query/kernel, ...): the layer
    applies them to Q, K, V and the context with heads x d in one axis (query_key_value, output_projection)."""

    config: Config
    kernel_axes: tuple[str, ...] = ("embed", "heads", "kv")  # an input projection's; the output's is the reverse
    bias_axes: tuple[str, ...] = ("heads", "kv")

    @nn.compact
    def __call__(self):
        cfg = self.config
        size = {"embed": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv": attention_head_width(cfg)}
        kernel = self.param("kernel", normal_init(cfg, self.kernel_axes), tuple(size[a] for a in self.kernel_axes),
                            param_dtype(cfg))
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                          tuple(size[a] for a in self.bias_axes), param_dtype(cfg))
        return kernel, bias


def query_key_value(config: Config, x: Array, weights: list, scale_query: bool = False) -> Array:
    """Q, K and V stacked [3, B, S, heads x d], in one matmul over the stacked kernels: its input gradient is one sum,
    reduced once over the tensor axis (three separate projections have three partial gradients to reduce). A
    token's heads lie side by side, as bert_jax's TPU kernel reads them: [.., heads, d] would pad each 64-wide head
    to a 128-lane row on TPU, in the stack a scanned step keeps and in every copy of it.

    `scale_query` multiplies Q by 1/sqrt(d), for splash (dot_product_attention's scaled_query), whose kernels do not
    scale the logits. Done on the stacked product (by 1/sqrt(d), 1, 1), the multiply fuses into the matmul and its
    gradient into the stacked gradient's consumers. splash_attention's own `q * scale` cost a pass over the query's
    gradient in the backward (0.2 ms a layer; unscanned, the bias gradient's reduction also took 0.48 ms a layer
    instead of 0.32): the train step of BERT-base s128 at 256 a chip on v5p-8, compiled for bfloat16, went from
    61.9 to 60.9 ms (97.5 to 93.3 at the cycle sum) unscanned, 79.2 to 78.0 ms (131.1 to 128.7) scanned, in the
    same memory. The rounding is the same as before.
    """
    dtype = compute_dtype(config)
    kernel = jnp.stack([in_lanes(kernel) for kernel, _ in weights]).astype(dtype)  # [3, H, heads x d]
    bias = jnp.stack([bias.reshape(-1) for _, bias in weights]).astype(dtype)
    if sharding.target_platform() == "cpu":  # one [B x S, H] x [H, 3 x heads x d] matmul (bfloat16_matmul's too)
        qkv = jnp.moveaxis(rows_dot_general(x.astype(dtype), jnp.moveaxis(kernel, 0, 1), (((2,), (0,)), ((), ()))),
                           2, 0)
    else:
        qkv = jnp.einsum("bsh,thn->tbsn", x.astype(dtype), kernel)
    qkv = add_bias(qkv, bias[:, None, None])
    return constrain(with_query_scaled(qkv, attention_head_width(config)) if scale_query else qkv, STACKED_LANES)


def output_projection(config: Config, context: Array, weights) -> Array:
    """The attention output projection of the context as dot_product_attention returns it, [B, S, heads x d] (the
    kernel's [heads, d] then taken as one axis) or [B, S, heads, d], as `dense` computes it (rows_dot_general on
    CPU)."""
    kernel, bias = weights
    kernel = kernel.reshape(-1, kernel.shape[-1]) if context.ndim == 3 else kernel  # [heads x d, H]
    contracted = kernel.ndim - 1
    dtype = compute_dtype(config)
    contracting = (tuple(range(context.ndim - contracted, context.ndim)), tuple(range(contracted)))
    out = linear_dot_general()(context.astype(dtype), kernel.astype(dtype), (contracting, ((), ())))
    return add_bias(out, bias.astype(dtype))


class PendingNorm(NamedTuple):
    """What a scanned layer carries to the next: its sum before the output LayerNorm, and that LayerNorm's parameters
    (TransformerLayer's defer_output_norm). Before the first layer nothing is pending: x is the embeddings' output.

    Carrying the layer's normalised output instead, the loop kept that sum in a stack of its own for the backward
    pass. BERT-base s128 at 256 a chip, scanned (v5p-8, compiler's estimates): 59.5 to 58.3 ms, 10.34 to 9.69 GB.
    """

    x: Array
    scale: Array
    bias: Array
    pending: Array  # bool, []

    @classmethod
    def start(cls, x: Array, config: Config) -> PendingNorm:
        zeros = jnp.zeros(x.shape[-1:], param_dtype(config))
        return cls(x, zeros, zeros, jnp.array(False))

    def resolve(self, config: Config) -> Array:
        """The layer output this stands for: the pending LayerNorm applied (elementwise select before the first)."""
        normalized = normalize(self.x, self.scale, self.bias, config.layer_norm_eps, compute_dtype(config))
        return constrain(jnp.where(self.pending, normalized, self.x), HIDDEN)


class OutputRows(NamedTuple):
    """The only rows of the encoder's output that are read, [B, P] positions (an MLM head's masked positions, with
    [CLS] for the pooler), and the mask of their queries, [B, 1, P, S] (attention_mask_for). The last layer then
    computes its query projection, attention output, FFN and LayerNorms at those rows alone; its keys and values
    still come from every row. BERT-base at 8 x 128 with 20 predictions a row: 5.6% of the step's model FLOPs, and
    on CPU about 5% of its time (benchmarks/RESULTS.md).
    """

    positions: Array
    mask: Array


# OutputRows' rows a row are padded to a multiple of this on a platform (row_positions); 1 where it is not named.
ROW_MULTIPLES = {"gpu": 16}


def row_positions(config: Config, output_positions: Array) -> Array:
    """OutputRows' positions [B, R]: [CLS] first where the pooler reads it, then output_positions, padded with [CLS]
    to a multiple of ROW_MULTIPLES' for the platform. Compiled for an H200 (jax 0.10.2), XLA:GPU fused the
    attention's transposed context into the output projection's Triton GEMM and found no tiling for it at 21 rows a
    row, nor at 20 or 6 ("Couldn't find output tile sizes"); at 16 and 32 it compiles."""
    positions = jnp.pad(output_positions, ((0, 0), (1, 0))) if config.pooler else output_positions
    multiple = ROW_MULTIPLES.get(sharding.target_platform(), 1)
    return jnp.pad(positions, ((0, 0), (0, -positions.shape[1] % multiple)))


def last_layer_at_rows(config: Config) -> bool:
    """Whether the encoder computes its last layer at OutputRows alone: the shared encoder does, its layers scanned
    or not. ModernBERT's computes every row and gathers them after: its long rows would need a kernel for few
    queries over many keys."""
    return families.of(config).encoder is None


class TransformerLayer(nn.Module):
    """One post-LN layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)). Returns (x, None) so nn.scan can carry x.

    With defer_output_norm (scanned under SCANNED_SAVES) it takes and returns a PendingNorm instead: the next layer,
    or the encoder after the loop, applies this layer's output LayerNorm. The backward pass keeps that LayerNorm's
    input anyway, so the loop's carry is that input and the loop keeps one [L, B, S, H] stack fewer.

    Given `rows` (OutputRows; the last layer only), it returns [B, P, H] at those rows.
    """

    config: Config
    deterministic: bool
    defer_output_norm: bool = False

    @nn.compact
    def __call__(self, carry, mask, rows: OutputRows | None = None):
        cfg = self.config
        x = carry.resolve(cfg) if self.defer_output_norm else constrain(carry, HIDDEN)
        projections = [ProjectionWeights(cfg, name=name)() for name in ("query", "key", "value")]
        dropout_rng = None
        if cfg.attention_probs_dropout_prob > 0.0 and not self.deterministic:
            dropout_rng = self.make_rng("dropout")
        if rows is None:
            scaled = attention_kernel(cfg, self.deterministic, x.shape[1]) == "splash"  # see query_key_value
            qkv = checkpoint_name(query_key_value(cfg, x, projections, scaled), QKV)
            context = dot_product_attention(qkv, mask, cfg, dropout_rng, scaled_query=scaled)
            context = constrain(context, LANES if context.ndim == 3 else PER_HEAD)
            layout = HIDDEN
        else:
            queries = constrain(gather_positions(x, rows.positions), ROWS)
            context = attention_at_rows(cfg, queries, x, rows.mask, projections, dropout_rng)
            x, layout = queries, ROWS
        attended = output_projection(cfg, context, ProjectionWeights(cfg, ("heads", "kv", "embed"), ("embed",),
                                                                     name="attention_output")())
        dropout = nn.Dropout(cfg.hidden_dropout_prob, deterministic=self.deterministic)
        x = checkpoint_name(x + dropout(constrain(attended, layout)), "attention_sum")
        x = layer_norm(cfg, "embed", "attention_norm")(x)
        h = constrain(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x), FFN_HIDDEN)
        h = checkpoint_name(h, "intermediate")
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(ACTIVATIONS[cfg.hidden_act](h))
        x = x + dropout(constrain(h, layout))
        output_norm = layer_norm(cfg, "embed", "output_norm")
        if self.defer_output_norm:
            return PendingNorm(constrain(x, HIDDEN), *output_norm.weights(), jnp.array(True)), None
        return constrain(output_norm(x), layout), None


def attention_at_rows(config: Config, queries: Array, x: Array, mask: Array, projections: list,
                      dropout_rng=None) -> Array:
    """The attention context [B, P, heads, d] of a few rows, queries [B, P, H], over the keys and values of every
    row of x [B, S, H], under OutputRows' mask. With few queries the probabilities, [B, heads, P, S], are small, so
    the reference computes them (with attention dropout when given a rng) on every platform."""
    width = attention_head_width(config)
    query = per_head(query_key_value(config, queries, projections[:1])[0], width)
    key, value = (per_head(t, width) for t in query_key_value(config, x, projections[1:]))
    return attention_per_head(query, key, value, mask, config, "reference", dropout_rng)


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
    instead (leading axis = layer), which compiles the stack once. Given `rows` (OutputRows), the output is
    [B, P, H] at those rows, the last layer computing only them (last_layer_at_rows; scanned, the loop runs one
    layer fewer and the last runs on its own: loop_then_last_at_rows).
    """

    config: Config

    @nn.compact
    def __call__(self, x, mask, deterministic: bool, rows: OutputRows | None = None):
        cfg = self.config
        layer_cls, defer = TransformerLayer, False
        if cfg.remat_policy != "none":
            layer_cls = nn.remat(TransformerLayer, policy=REMAT_POLICIES[cfg.remat_policy],
                                 prevent_cse=not cfg.scan_layers)
        elif cfg.scan_layers:
            layer_cls = nn.remat(TransformerLayer, policy=SCANNED_SAVES, prevent_cse=False)
            defer = True  # the output LayerNorm's input is the carry, not a stack beside it (PendingNorm)
        groups = cfg.num_hidden_groups
        repeats = cfg.num_hidden_layers // groups
        # Scanned, the last loop runs a layer short and its last layer runs at the rows; init builds the loops whole.
        last_at_rows = rows is not None and not self.is_initializing()
        if stacks_layers(cfg):
            stack = lambda length: nn.scan(
                layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast, length=length, metadata_params={nn.PARTITION_NAME: "layers"})
            if last_at_rows:
                return self.loop_then_last_at_rows(stack, layer_cls, "layers", groups, defer, x, mask, rows,
                                                   deterministic)
            x = run_loop(stack(groups)(cfg, deterministic, defer, name="layers"), x, mask, cfg, defer)
        elif cfg.scan_layers:
            shared = lambda length: nn.scan(layer_cls, variable_broadcast="params",
                                            split_rngs={"params": False, "dropout": True}, in_axes=nn.broadcast,
                                            length=length)
            for group in range(groups):
                if last_at_rows and group == groups - 1:
                    return self.loop_then_last_at_rows(shared, layer_cls, f"layer_{group}", repeats, defer, x, mask,
                                                       rows, deterministic)
                x = run_loop(shared(repeats)(cfg, deterministic, defer, name=f"layer_{group}"), x, mask, cfg, defer)
        else:
            for group in range(groups):
                layer = layer_cls(cfg, deterministic, name=f"layer_{group}")
                for repeat in range(repeats):
                    last = (group, repeat) == (groups - 1, repeats - 1)
                    x, _ = layer(x, mask, rows if last else None)
            return x
        return x if rows is None else constrain(gather_positions(x, rows.positions), ROWS)

    def loop_then_last_at_rows(self, loop, layer_cls, name: str, length: int, defer: bool, x, mask, rows: OutputRows,
                               deterministic: bool):
        """The scanned loop `name` of `length` layers (built by `loop(length)`) run a layer short, then its last layer
        at `rows` alone, each bound to the loop's own parameters: a stack's split into its first length - 1 layers
        (a copy of them each step) and its last; shared ones as they are."""
        params = self.variables["params"][name]
        split = stacks_layers(self.config)
        loop_params = jax.tree.map(lambda p: p[:-1], params) if split else params
        last_params = jax.tree.map(lambda p: p[-1], params) if split else params
        dropout = not deterministic and self.has_rng("dropout")
        rngs = [{"dropout": key} for key in jax.random.split(self.make_rng("dropout"))] if dropout else [{}, {}]
        if length > 1:
            head = loop(length - 1)(self.config, deterministic, defer, parent=None)
            x = run_loop(head.bind({"params": loop_params}, rngs=rngs[0]), x, mask, self.config, defer)
        last = layer_cls(self.config, deterministic, parent=None).bind({"params": last_params}, rngs=rngs[1])
        return last(x, mask, rows)[0]


def run_loop(loop: nn.Module, x: Array, mask: Array, config: Config, defer_output_norm: bool) -> Array:
    """A scanned stack of layers applied to x; deferring each output LayerNorm, it carries a PendingNorm."""
    if not defer_output_norm:
        return loop(x, mask)[0]
    carry, _ = loop(PendingNorm.start(x, config), mask)
    return carry.resolve(config)


class EncoderModel(nn.Module):
    """The backbone every family keeps: embeddings -> (E -> H projection) -> encoder -> pooler.

    `shared_embeddings` lets ELECTRA's generator and discriminator use one Embeddings module owned by their parent.
    Returns {"last_hidden_state": [B, S, H], "pooler_output": [B, H] (when config.pooler)}; given
    `output_positions` [B, P] (the positions an MLM head reads), last_hidden_state is [B, P, H] at those, and the
    last layer computes only them and [CLS] (OutputRows).
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
                 packing_segment_ids=None, output_positions=None, deterministic: bool = True):
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = position_ids_for(cfg, input_ids)
        x = self.token_embeddings()(input_ids, token_type_ids, position_ids, deterministic)
        if has_embedding_projection(cfg):
            x = constrain(self.embedding_projection(x), HIDDEN)
        mask = layer_mask(cfg, attention_mask, packing_segment_ids, deterministic)
        rows = None
        if output_positions is not None:
            positions = row_positions(cfg, output_positions)
            rows = OutputRows(positions, attention_mask_for(attention_mask, packing_segment_ids, positions))
        x = self.encoder(x, mask, deterministic, rows)
        outputs = {"last_hidden_state": x}
        if rows is not None:  # the pooler's [CLS] is row 0, the requested rows follow, then any padding
            first = int(cfg.pooler)
            outputs["last_hidden_state"] = x[:, first:first + output_positions.shape[1]]
        if cfg.pooler:
            outputs["pooler_output"] = jnp.tanh(self.pooler(constrain(x[:, 0], POOLED)))
        return outputs
