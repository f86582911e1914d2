"""ModernBERT (Warner et al., 2024): a pre-norm encoder with rotary positions, GeGLU and alternating attention.

What differs from the BERT-style encoder of bert_jax.modeling.transformer:
  - no position or token-type embeddings: rotary positions (RoPE) on queries and keys, with base theta
    global_rope_theta in global layers and local_rope_theta in local ones;
  - every global_attn_every_n_layers-th layer (0, n, 2n, ...) attends globally, the others within a sliding window
    of local_attention tokens in all (a query sees keys at distance <= local_attention // 2);
  - pre-norm: x + Attn(LN(x)), x + FFN(LN(x)); layer 0 has no attention LayerNorm (the embeddings' one precedes it),
    and a final LayerNorm follows the last layer; LayerNorms and linears have no biases by default;
  - GeGLU FFN: Wi projects to 2 x intermediate_size, act(first half) * second half, then Wo;
  - no pooler; the MLM head is dense H -> H, activation, LayerNorm, then logits tied to the word table plus a bias.

Parameters (bert_jax names; HF's fused Wqkv [3H, H] and Wi [2I, H] are kept fused, their halves on an axis of
their own so that heads and FFN width still shard over tensor):
  embeddings/word_embeddings/embedding [V, H]   embeddings/norm/scale [H]
  encoder/layer_i/attention_norm/scale [H]      (not in layer 0)
  encoder/layer_i/qkv/kernel [H, 3, heads, d]   encoder/layer_i/attention_output/kernel [heads, d, H]
  encoder/layer_i/mlp_norm/scale [H]
  encoder/layer_i/intermediate/kernel [H, 2, I] encoder/layer_i/output/kernel [I, H]
  final_norm/scale [H]
  (with norm_bias / attention_bias / mlp_bias: the matching `bias` parameters too)
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bert_jax.config_lib import ConfigError
from bert_jax.families import Family, HfConversion, HfNames, Tokenizer
from bert_jax.modeling.models import vocab_logits
from bert_jax.modeling.transformer import (ACTIVATIONS, FFN_HIDDEN, HIDDEN, PER_HEAD, REMAT_POLICIES, ROWS, Config,
                                           compute_dtype, constrain, dot_product_attention, gather_positions,
                                           layer_mask, lookup, padded_vocab_size, param_dtype)

# The keys ModernBERT adds to config_lib.model_config, with the paper's values. LayerNorms use layer_norm_eps.
MODEL_DEFAULTS = dict(
    global_attn_every_n_layers=3,  # layers 0, n, 2n, ... attend globally, the others locally
    local_attention=128,  # the local layers' window, both sides together: keys at distance <= 64
    global_rope_theta=160_000.0,
    local_rope_theta=10_000.0,
    attention_bias=False,
    mlp_bias=False,
    norm_bias=False,
    classifier_bias=False,  # the MLM head's dense layer
    classifier_activation="gelu",  # the MLM head's activation (the FFN's is hidden_act)
    initializer_cutoff_factor=2.0,  # weights are drawn from a normal truncated at this many standard deviations
)
# ModernBERT's common keys: OLMo's tokenizer (50368 ids with room to spare), no dropout, 8192 positions, no pooler.
MODERNBERT = dict(vocab_size=50368, max_position_embeddings=8192, type_vocab_size=1, pad_token_id=50283,
                  layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pooler=False)
# The presets pretrain phase 1 of the paper's recipe (1024 tokens, global RoPE theta 10k); context extension (phase
# 2) raises it to 160k, the value the released models hold (docs/recipes.md has the three phases).
PHASE1 = dict(global_rope_theta=10_000.0)
SIZES = {
    # tiny trains on the bundled corpus with the repository's 8k byte-level BPE (<pad> = 1).
    "tiny": dict(MODERNBERT, **PHASE1, vocab_size=8000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                 intermediate_size=96, max_position_embeddings=512, pad_token_id=1, local_attention=8),
    "base": dict(MODERNBERT, **PHASE1, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                 intermediate_size=1152),
    "large": dict(MODERNBERT, **PHASE1, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                  intermediate_size=2624),
}
# The paper's optimizer (Warner et al. 2024, section 2.2 and the training-settings table): StableAdamW, betas
# (0.9, 0.98), eps 1e-6, weight decay 1e-5 fully decoupled from the rate (optimi's decouple_lr, as its training code
# sets it) and kept off biases and norms; a warmup-stable-decay schedule with a 1-sqrt decay.
OPTIMIZER = dict(schedule="wsd", decay="1-sqrt", b2=0.98, eps=1e-6, weight_decay=1e-5,
                 fully_decoupled_weight_decay=True)


# ---------------------------------------------------------------------------------------------- building blocks


def weight_init(config: Config, axes: tuple, std: float | None = None, vocab_rows: bool = False):
    """ModernBERT's truncated normal (cut at initializer_cutoff_factor standard deviations), tagged with logical
    axes; `vocab_rows` zeroes the padding rows past vocab_size as transformer.word_table_init does."""
    std = config.initializer_range if std is None else std
    cutoff = config.initializer_cutoff_factor
    normal = nn.initializers.truncated_normal(stddev=std, lower=-cutoff, upper=cutoff)

    def init(key, shape, dtype=jnp.float32):
        x = normal(key, shape, dtype)
        return x.at[config.vocab_size:].set(0) if vocab_rows else x

    return nn.with_logical_partitioning(init, axes)


def out_std(config: Config) -> float:
    """The output projections' (attention Wo, FFN Wo, head dense) smaller std: initializer_range / sqrt(2 L)."""
    return config.initializer_range / np.sqrt(2.0 * config.num_hidden_layers)


def linear(config: Config, features, axes: tuple, name: str, use_bias: bool, std: float | None = None,
           axis=-1) -> nn.DenseGeneral:
    """transformer.dense with ModernBERT's optional bias and truncated-normal kernel."""
    num_outputs = len(features) if isinstance(features, tuple) else 1
    return nn.DenseGeneral(
        features, axis=axis, use_bias=use_bias, dtype=compute_dtype(config), param_dtype=param_dtype(config),
        kernel_init=weight_init(config, axes, std),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[-num_outputs:]), name=name)


def norm(config: Config, axis_name: str, name: str) -> nn.LayerNorm:
    """transformer.layer_norm (two-pass statistics, float32) with ModernBERT's optional bias."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, use_bias=config.norm_bias, dtype=compute_dtype(config),
        param_dtype=param_dtype(config), use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis_name,)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis_name,)), name=name)


def is_global_layer(config: Config, layer: int) -> bool:
    return layer % config.global_attn_every_n_layers == 0


def attention_half_window(config: Config, layer: int) -> int | None:
    """How far a query of `layer` sees on either side: None in global layers, local_attention // 2 in local ones."""
    return None if is_global_layer(config, layer) else config.local_attention // 2


def rotary(x, position_ids, theta: float):
    """RoPE over [B, S, heads, d], rotating the two halves of each head (not interleaved pairs): angles in float32,
    the rotation in x's dtype with cos and sin rounded to it, as HF's ModernBERT does (in bfloat16 a float32
    rotation cost 10% of the step in XLA:TPU's estimate at 8192 tokens)."""
    d = x.shape[-1]
    inverse_frequencies = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = position_ids[..., None].astype(jnp.float32) * inverse_frequencies  # [B, S, d/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    first, second = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return x * jnp.cos(angles).astype(x.dtype) + rotated * jnp.sin(angles).astype(x.dtype)


# ------------------------------------------------------------------------------------------------------ modules


class Embeddings(nn.Module):
    """Word embeddings (padded_vocab_size rows), LayerNorm, dropout; no position or token-type tables."""

    config: Config

    def setup(self):
        cfg = self.config
        self.word_embeddings = nn.Embed(
            padded_vocab_size(cfg), cfg.hidden_size, dtype=compute_dtype(cfg), param_dtype=param_dtype(cfg),
            embedding_init=weight_init(cfg, ("vocab", "token_embed"), vocab_rows=True))
        self.norm = norm(cfg, "token_embed", "norm")
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def __call__(self, input_ids, deterministic: bool):
        x = constrain(lookup(self.word_embeddings, input_ids, "activation_vocab"), HIDDEN)
        return self.dropout(self.norm(x), deterministic=deterministic)


class Layer(nn.Module):
    """One pre-norm layer: x + Attn(LN(x)) with RoPE, then x + GeGLU(LN(x)). Layer `index` is global or local
    (attention_half_window), and layer 0 has no attention LayerNorm: the embeddings' one has just normalised x."""

    config: Config
    deterministic: bool
    index: int

    @nn.compact
    def __call__(self, x, position_ids, mask):
        cfg = self.config
        heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        x = constrain(x, HIDDEN)
        h = norm(cfg, "embed", "attention_norm")(x) if self.index > 0 else x
        qkv = linear(cfg, (3, heads, d), ("embed", None, "heads", "kv"), "qkv", cfg.attention_bias)(h)
        theta = cfg.global_rope_theta if is_global_layer(cfg, self.index) else cfg.local_rope_theta
        q, k, v = (constrain(qkv[..., i, :, :], PER_HEAD) for i in range(3))
        q, k = rotary(q, position_ids, theta), rotary(k, position_ids, theta)
        dropout_rng = None
        if cfg.attention_probs_dropout_prob > 0.0 and not self.deterministic:
            dropout_rng = self.make_rng("dropout")
        context = dot_product_attention((q, k, v), mask, cfg, dropout_rng, attention_half_window(cfg, self.index))
        attended = linear(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "attention_output", cfg.attention_bias,
                          std=out_std(cfg), axis=(-2, -1))(constrain(context, PER_HEAD))
        # As HF's ModernBERT: attention dropout also on the attention output; hidden dropout inside the FFN.
        attended = nn.Dropout(cfg.attention_probs_dropout_prob)(attended, deterministic=self.deterministic)
        x = x + constrain(attended, HIDDEN)
        h = linear(cfg, (2, cfg.intermediate_size), ("embed", None, "mlp"), "intermediate", cfg.mlp_bias)(
            norm(cfg, "embed", "mlp_norm")(x))
        h = constrain(ACTIVATIONS[cfg.hidden_act](h[..., 0, :]) * h[..., 1, :], FFN_HIDDEN)
        h = nn.Dropout(cfg.hidden_dropout_prob)(h, deterministic=self.deterministic)
        h = linear(cfg, cfg.hidden_size, ("mlp", "embed"), "output", cfg.mlp_bias, std=out_std(cfg))(h)
        return constrain(x + constrain(h, HIDDEN), HIDDEN)


class Layers(nn.Module):
    """layer_0 ... layer_{L-1}, global or local by position; one layer's weights each (no sharing, no scan)."""

    config: Config

    @nn.compact
    def __call__(self, x, position_ids, mask, deterministic: bool):
        cfg = self.config
        layer_cls = Layer
        if cfg.remat_policy != "none":
            layer_cls = nn.remat(Layer, policy=REMAT_POLICIES[cfg.remat_policy])
        for i in range(cfg.num_hidden_layers):
            x = layer_cls(cfg, deterministic, i, name=f"layer_{i}")(x, position_ids, mask)
        return x


def check_config(config: Config) -> None:
    """Raise ConfigError naming a key this family cannot honour."""
    if config.global_attn_every_n_layers < 1:
        raise ConfigError(f"config.model.global_attn_every_n_layers={config.global_attn_every_n_layers}: must be >= 1")
    if (config.hidden_size // config.num_attention_heads) % 2:
        raise ConfigError(f"config.model.hidden_size={config.hidden_size}: RoPE needs an even head width "
                          f"(hidden_size / num_attention_heads)")


class Encoder(nn.Module):
    """The ModernBERT backbone: embeddings -> layers -> final LayerNorm. Returns {"last_hidden_state": [B, S, H]},
    or [B, P, H] at `output_positions` [B, P] when given (every layer still computes every row: last_layer_at_rows).

    token_type_ids are accepted (the shared call signature) and ignored. Packed rows (packing_segment_ids) attend
    within their own example; RoPE and the window depend only on distances, so positions need no restart.
    """

    config: Config
    shared_embeddings: nn.Module | None = None

    def setup(self):
        check_config(self.config)
        if self.shared_embeddings is None:
            self.embeddings = Embeddings(self.config)
        self.encoder = Layers(self.config)
        self.final_norm = norm(self.config, "embed", "final_norm")

    def token_embeddings(self) -> Embeddings:
        return self.shared_embeddings if self.shared_embeddings is not None else self.embeddings

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                 packing_segment_ids=None, output_positions=None, deterministic: bool = True) -> dict:
        cfg = self.config
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
        x = self.token_embeddings()(input_ids, deterministic)
        mask = layer_mask(cfg, attention_mask, packing_segment_ids, deterministic)
        x, layout = self.encoder(x, position_ids, mask, deterministic), HIDDEN
        if output_positions is not None:
            x, layout = gather_positions(x, output_positions), ROWS
        return {"last_hidden_state": constrain(self.final_norm(x), layout)}


class MlmHead(nn.Module):
    """dense H -> H, activation, LayerNorm, then logits tied to the word table plus a per-token bias.

    As models.MlmHead: it projects the hidden states it is given (the masked positions' in pretraining); the
    logits have padded_vocab_size columns, those from vocab_size on holding MASKED_LOGIT.
    """

    config: Config

    @nn.compact
    def __call__(self, hidden, word_embeddings):
        cfg = self.config
        x = linear(cfg, cfg.hidden_size, ("embed", "token_embed"), "transform", cfg.classifier_bias,
                   std=out_std(cfg))(constrain(hidden, ROWS))
        x = norm(cfg, "token_embed", "norm")(ACTIVATIONS[cfg.classifier_activation](x))
        return vocab_logits(self, x, word_embeddings, cfg)


# ---------------------------------------------------------------------------------- HF transformers conversion

HF_ARCHITECTURES = {"backbone": "ModernBertModel", "masked_lm": "ModernBertForMaskedLM"}
# Tied or buffer tensors: the decoder weight is the word table.
DERIVED_SUFFIXES = ("decoder.weight",)


def _layer_modules(model: Config, layer: int, hf_layer: str, ours: str) -> list[tuple[str, str, str, bool]]:
    """(HF module, bert_jax module, kind, has a bias) of one layer."""
    modules = [] if layer == 0 else [(f"{hf_layer}.attn_norm", f"{ours}/attention_norm", "layer_norm",
                                      model.norm_bias)]
    return modules + [
        (f"{hf_layer}.attn.Wqkv", f"{ours}/qkv", "qkv", model.attention_bias),
        (f"{hf_layer}.attn.Wo", f"{ours}/attention_output", "attention_output", model.attention_bias),
        (f"{hf_layer}.mlp_norm", f"{ours}/mlp_norm", "layer_norm", model.norm_bias),
        (f"{hf_layer}.mlp.Wi", f"{ours}/intermediate", "wi", model.mlp_bias),
        (f"{hf_layer}.mlp.Wo", f"{ours}/output", "linear", model.mlp_bias),
    ]


def _modules(model: Config, head: str, hf_base: str) -> list[tuple[str, str, str, bool]]:
    """(HF module, bert_jax module, kind, has a bias) of the whole model with this head."""
    if head not in HF_ARCHITECTURES:
        raise ConfigError(f"modernbert has no {head!r} head; choose one of {tuple(HF_ARCHITECTURES)}")
    hf = f"{hf_base}." if hf_base else ""
    ours = "" if head == "backbone" else "backbone/"
    modules = [(f"{hf}embeddings.tok_embeddings", f"{ours}embeddings/word_embeddings", "embedding", False),
               (f"{hf}embeddings.norm", f"{ours}embeddings/norm", "layer_norm", model.norm_bias)]
    for layer in range(model.num_hidden_layers):
        modules += _layer_modules(model, layer, f"{hf}layers.{layer}", f"{ours}encoder/layer_{layer}")
    modules.append((f"{hf}final_norm", f"{ours}final_norm", "layer_norm", model.norm_bias))
    if head == "masked_lm":
        modules += [("head.dense", "mlm_head/transform", "linear", model.classifier_bias),
                    ("head.norm", "mlm_head/norm", "layer_norm", model.norm_bias),
                    ("decoder.bias", "mlm_head", "vector", True)]
    return modules


def hf_tensor_pairs(model: Config, head: str, hf_base: str):
    """Every (HF tensor name, bert_jax parameter path, kind) of a ModernBERT with this head ("backbone": HF's
    ModernBertModel, hf_base "" or "model"; "masked_lm": ModernBertForMaskedLM, hf_base "model")."""
    for hf_module, our_module, kind, has_bias in _modules(model, head, hf_base):
        if kind == "vector":
            yield hf_module, f"{our_module}/bias", "vector.bias"
            continue
        weight = "embedding" if kind == "embedding" else "scale" if kind == "layer_norm" else "kernel"
        yield f"{hf_module}.weight", f"{our_module}/{weight}", f"{kind}.{weight}"
        if has_bias:
            yield f"{hf_module}.bias", f"{our_module}/bias", f"{kind}.bias"


def to_ours(array: np.ndarray, kind: str, model: Config) -> np.ndarray:
    """An HF tensor in bert_jax's layout (PyTorch Linear weights are [out, in]; fused halves get their own axis)."""
    heads = model.num_attention_heads
    if kind == "linear.kernel":
        return array.T
    if kind == "qkv.kernel":
        return array.T.reshape(array.shape[1], 3, heads, -1)
    if kind == "qkv.bias":
        return array.reshape(3, heads, -1)
    if kind == "attention_output.kernel":
        return array.T.reshape(heads, -1, array.shape[0])
    if kind == "wi.kernel":
        return array.T.reshape(array.shape[1], 2, -1)
    if kind == "wi.bias":
        return array.reshape(2, -1)
    return array


def to_hf(array: np.ndarray, kind: str, model: Config) -> np.ndarray:
    """The inverse of to_ours."""
    if kind == "linear.kernel":
        return array.T
    if kind in ("qkv.kernel", "wi.kernel"):
        return array.reshape(array.shape[0], -1).T
    if kind in ("qkv.bias", "wi.bias"):
        return array.reshape(-1)
    if kind == "attention_output.kernel":
        return array.reshape(-1, array.shape[-1]).T
    return array


# ------------------------------------------------------------------------------------------------ HF config.json

_HF_SAME_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "initializer_range", "pad_token_id", "local_attention", "attention_bias",
                 "mlp_bias", "norm_bias", "classifier_bias", "classifier_activation", "initializer_cutoff_factor")


def hf_config(model: Config, head: str) -> dict:
    """The config.json dict transformers' ModernBertConfig reads for this model and head."""
    if head not in HF_ARCHITECTURES:
        raise ConfigError(f"modernbert has no {head!r} head; choose one of {tuple(HF_ARCHITECTURES)}")
    hf = {key: model[key] for key in _HF_SAME_KEYS}
    layer_types = ["full_attention" if is_global_layer(model, i) else "sliding_attention"
                   for i in range(model.num_hidden_layers)]
    hf.update(
        model_type="modernbert", architectures=[HF_ARCHITECTURES[head]], hidden_activation=model.hidden_act,
        norm_eps=model.layer_norm_eps, embedding_dropout=model.hidden_dropout_prob,
        mlp_dropout=model.hidden_dropout_prob, attention_dropout=model.attention_probs_dropout_prob,
        decoder_bias=True, tie_word_embeddings=True, layer_types=layer_types,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": model.global_rope_theta},
                         "sliding_attention": {"rope_type": "default", "rope_theta": model.local_rope_theta}})
    return hf


def _every_n(layer_types: list[str]) -> int:
    """global_attn_every_n_layers from HF's per-layer list; an error if the list follows no such pattern."""
    later_global = [i for i, kind in enumerate(layer_types) if i > 0 and kind == "full_attention"]
    every = later_global[0] if later_global else max(len(layer_types), 1)
    expected = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(len(layer_types))]
    if layer_types != expected:
        raise ConfigError(f"config.json layer_types={layer_types}: bert_jax's ModernBERT needs a global layer every "
                          "n layers (0, n, 2n, ...) and sliding ones between")
    return every


def _rope_theta(hf: dict, layer_type: str, old_key: str, default: float) -> float:
    """The RoPE base of one layer type, from rope_parameters (transformers 5) or the older flat key."""
    params = (hf.get("rope_parameters") or {}).get(layer_type) or {}
    if params.get("rope_type", "default") != "default":
        raise ConfigError(f"config.json rope_parameters[{layer_type!r}] rope_type={params['rope_type']!r}: only "
                          "'default' RoPE is supported")
    return float(params.get("rope_theta", hf.get(old_key, default)))


def sizes_from_hf(hf: dict) -> dict:
    """The config_lib.model_config("modernbert", **sizes) keyword arguments of an HF config.json dict."""
    if not hf.get("decoder_bias", True):
        raise ConfigError("config.json decoder_bias=False: bert_jax's MLM head always has a bias")
    if hf.get("embedding_dropout", 0.0) != hf.get("mlp_dropout", 0.0):
        raise ConfigError(f"config.json embedding_dropout={hf.get('embedding_dropout')} and mlp_dropout="
                          f"{hf.get('mlp_dropout')} differ; bert_jax uses one hidden_dropout_prob for both")
    sizes = dict(MODEL_DEFAULTS, **MODERNBERT)
    sizes.update({key: hf[key] for key in _HF_SAME_KEYS if hf.get(key) is not None})
    layer_types = hf.get("layer_types")
    every = (_every_n(list(layer_types)) if layer_types is not None
             else hf.get("global_attn_every_n_layers", MODEL_DEFAULTS["global_attn_every_n_layers"]))
    sizes.update(
        hidden_act=hf.get("hidden_activation", "gelu"), layer_norm_eps=hf.get("norm_eps", 1e-5),
        hidden_dropout_prob=hf.get("mlp_dropout", 0.0), attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
        global_attn_every_n_layers=every,
        global_rope_theta=_rope_theta(hf, "full_attention", "global_rope_theta", MODEL_DEFAULTS["global_rope_theta"]),
        local_rope_theta=_rope_theta(hf, "sliding_attention", "local_rope_theta", MODEL_DEFAULTS["local_rope_theta"]))
    return sizes


# ---------------------------------------------------------------------------------------------- the family

FAMILY = Family(
    name="modernbert",
    title="ModernBERT",
    published="2024-12",
    recipe="MLM at 30%, packed, StableAdamW, WSD 1-sqrt; RoPE, GeGLU, local/global attention",
    objective="mlm",
    sizes={size: {**MODEL_DEFAULTS, **sizes} for size, sizes in SIZES.items()},
    paper_params_millions={"base": 149, "large": 395},
    default_size="base",
    # OLMo's 50k byte-level BPE is not bundled: set config.data.tokenizer_path for full-size runs.
    tokenizer=Tokenizer("bpe", "data/roberta-bpe8k"),
    example_kind="packed_documents",  # unpadded: every sequence full, attention within each document
    masking=dict(rate=0.3, max_predictions_per_seq=40),  # the paper's 30% masking rate
    optimizer="stable_adamw",
    optimizer_settings=OPTIMIZER,
    learning_rates={"base": 8e-4, "large": 5e-4},  # the paper's peak rates (large later restarted at 5e-5)
    hf=HfNames(base_prefix="model", architectures=HF_ARCHITECTURES, pooler=None,
               mlm=("head.dense", "head.norm", "decoder.bias"),
               special_token_ids={"bos_token_id": 50281, "cls_token_id": 50281, "eos_token_id": 50282,
                                  "sep_token_id": 50282}),
    ffn_matrices=3,  # GeGLU: Wi is two H x I matrices, then Wo
    attention_half_window=attention_half_window,
    phase_keys=("global_rope_theta", "local_rope_theta"),  # context extension raises the global one
    scans_layers=False,  # layers differ: attention window, RoPE theta, layer 0 without an attention LayerNorm
    stacked_qkv=False,  # RoPE rotates Q and K apart from V
    pair_token_types=False,
    encoder=Encoder,
    mlm_head=MlmHead,
    hf_conversion=HfConversion(tensor_pairs=hf_tensor_pairs, to_ours=to_ours, to_hf=to_hf, config_to_hf=hf_config,
                               sizes_from_hf=sizes_from_hf, derived_suffixes=DERIVED_SUFFIXES),
)
