"""Splash attention (attention_impl="splash") against the reference attention, in Pallas' interpret mode on CPU:
forward outputs and gradients for padding, packed examples (segment ids, no [B, S, S] mask) and local windows, at
the real tokens (a padding query attends to the padding only under splash; no real output depends on it). Shapes
are tiny: the interpreter runs every tile one after another.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import config_lib, flops
from bert_jax.config_lib import ConfigError
from bert_jax.families import modernbert
from bert_jax.modeling import transformer

HEADS, WIDTH = 2, 16


def inputs(seq: int, packed: bool):
    """q, k, v [2, S, heads, d]; row 0 real throughout, row 1 with its last quarter padded; packed rows hold two
    examples (ids 1 and 2, 0 on padding) as the pipeline writes them."""
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, seq, HEADS, WIDTH), jnp.float32)
    attention_mask = np.ones((2, seq), np.int32)
    attention_mask[1, -seq // 4:] = 0
    packing = None
    if packed:
        packing = np.where(np.arange(seq) < seq // 3, 1, 2)[None].repeat(2, 0) * attention_mask
    return q, k, v, jnp.asarray(attention_mask), packing


def attention(kind: str, q, k, v, attention_mask, packing, half_window):
    """The layers' attention over q, k, v stacked as their projection writes them, [3, B, S, heads x d]; the
    context [B, S, heads, d] (bert_jax's kernel gives it [B, S, heads x d])."""
    config = config_lib.model_config("bert", attention_impl=kind, attention_probs_dropout_prob=0.0,
                                     hidden_size=HEADS * WIDTH, num_attention_heads=HEADS)
    mask = transformer.layer_mask(config, attention_mask, packing, deterministic=True)
    context = transformer.dot_product_attention(jnp.stack([transformer.in_lanes(x) for x in (q, k, v)]), mask,
                                                config, half_window=half_window)
    return transformer.per_head(context, WIDTH) if context.ndim == 3 else context


MASKS = {  # name: (sequence length, packed, half window)
    "padding": (128, False, None),
    "packed": (128, True, None),
    "local window": (128, False, 4),
    "local window over three 128-token tiles, packed": (384, True, 40),
}


def test_the_masks_cover_both_backward_kernels():
    """splash_kernel fuses the backward pass over a single kv tile only; the parity cases must run both kinds."""
    kinds = {transformer.splash_fused_backward(seq, half_window) for seq, _, half_window in MASKS.values()}
    assert kinds == {True, False}


@pytest.mark.parametrize("name", MASKS)
def test_splash_matches_the_reference_forward_and_backward(name):
    seq, packed, half_window = MASKS[name]
    q, k, v, attention_mask, packing = inputs(seq, packed)
    real = attention_mask[:, :, None, None].astype(jnp.float32)
    weights = jax.random.normal(jax.random.key(1), q.shape)

    def loss(kind, q, k, v):
        out = attention(kind, q, k, v, attention_mask, packing, half_window)
        return jnp.sum(out * weights * real), out

    def outputs_and_grads(kind):
        return jax.jit(jax.value_and_grad(lambda *x: loss(kind, *x), argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, ours), our_grads = outputs_and_grads("splash")
    (_, ref), ref_grads = outputs_and_grads("reference")
    np.testing.assert_allclose(ours * real, ref * real, atol=2e-5)
    for ours_grad, ref_grad in zip(our_grads, ref_grads):
        np.testing.assert_allclose(ours_grad, ref_grad, atol=5e-5)


def test_packed_splash_sees_no_other_example():
    """Changing the second example's keys and values leaves the first example's outputs exactly as they were."""
    q, k, v, attention_mask, packing = inputs(128, packed=True)
    other = jnp.asarray(packing == 2)[:, :, None, None]
    splash = jax.jit(lambda k, v: attention("splash", q, k, v, attention_mask, packing, None))
    before = splash(k, v)
    after = splash(jnp.where(other, 7.0, k), jnp.where(other, -3.0, v))
    first = jnp.asarray(packing == 1)[:, :, None, None]
    np.testing.assert_array_equal(before * first, after * first)
    assert not np.allclose(before * other, after * other)


def tiny_modernbert(impl: str):
    """The tiny preset cut to its first two layers: one global, one local (half window 4)."""
    return config_lib.model_config("modernbert", **{**modernbert.MODEL_DEFAULTS, **modernbert.SIZES["tiny"],
                                                    "num_hidden_layers": 2, "attention_impl": impl})


def test_splash_layers_take_segment_ids_instead_of_a_square_mask():
    mask = transformer.layer_mask(tiny_modernbert("splash"), jnp.ones((2, 256), jnp.int32), None, deterministic=True)
    assert mask.shape == (2, 256) and mask.dtype == jnp.int32


def test_modernbert_with_splash_matches_the_reference_model():
    """A tiny ModernBERT on packed rows with padding: the same hidden states at the real tokens with either
    attention."""
    seq = 128
    input_ids = np.random.default_rng(0).integers(5, 8000, size=(2, seq))
    _, _, _, attention_mask, packing = inputs(seq, packed=True)
    outputs = {}
    for impl in ("reference", "splash"):
        model = modernbert.Encoder(tiny_modernbert(impl))
        params = nn.unbox(model.init(jax.random.key(0), input_ids, attention_mask)["params"])
        apply = jax.jit(lambda params: model.apply({"params": params}, input_ids, attention_mask,
                                                   packing_segment_ids=packing)["last_hidden_state"])
        outputs[impl] = apply(params)
    real = np.asarray(attention_mask)[:, :, None]
    np.testing.assert_allclose(outputs["splash"] * real, outputs["reference"] * real, atol=2e-5)


def test_splash_refuses_untiled_lengths_in_one_line():
    config = config_lib.model_config("bert", attention_impl="splash", attention_probs_dropout_prob=0.1)
    with pytest.raises(ConfigError, match="sequence length 200 must be a multiple of 128"):
        transformer.attention_kernel(config, deterministic=True, seq_length=200)


def test_local_layers_count_only_their_window_in_the_flops():
    """flops.attended_pairs is the number of True entries of the window mask the model applies, splash_tiles the
    number of 128-token tile pairs that mask reaches."""
    for seq, half_window in [(24, 4), (1000, 64), (16, 20)]:
        index = np.arange(seq)
        near = np.abs(index[:, None] - index[None]) <= half_window
        assert flops.attended_pairs(seq, half_window) == int(near.sum())
    window = np.abs(np.arange(384)[:, None] - np.arange(384)[None]) <= 40
    assert transformer.splash_tiles(384, 40) == int(window.reshape(3, 128, 3, 128).any(axis=(1, 3)).sum()) == 7
    base, global_only = (config_lib.load_preset("modernbert", "base").model for _ in range(2))
    global_only.global_attn_every_n_layers = 1
    saved = flops.encoder_forward_flops(global_only, 8192) - flops.encoder_forward_flops(base, 8192)
    local_layers = sum(not modernbert.is_global_layer(base, i) for i in range(base.num_hidden_layers))
    assert saved == local_layers * 4 * base.hidden_size * (8192 ** 2 - flops.attended_pairs(8192, 64))


def test_bert_with_splash_matches_the_reference_model():
    """A tiny BERT on padded rows, whose splash layers take the query scaled in its projection (query_key_value's
    scale_query): the same hidden states and parameter gradients as the reference attention at the real tokens.
    Heads 24 wide, so that 1/sqrt(d) is no power of two."""
    seq = 128
    input_ids = np.random.default_rng(0).integers(5, 1000, size=(2, seq))
    _, _, _, attention_mask, _ = inputs(seq, packed=False)
    real = np.asarray(attention_mask)[:, :, None]
    weights = jax.random.normal(jax.random.key(1), (2, seq, 96))
    results = {}
    for impl in ("reference", "splash"):
        config = config_lib.load_preset("bert", "tiny").model
        config.update(attention_impl=impl, attention_probs_dropout_prob=0.0, hidden_size=96)
        model = transformer.EncoderModel(config)
        params = nn.unbox(model.init(jax.random.key(0), input_ids, attention_mask)["params"])

        def loss(params):
            hidden = model.apply({"params": params}, input_ids, attention_mask)["last_hidden_state"]
            return jnp.sum(hidden * weights * real), hidden

        results[impl] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    (_, ours), our_grads = results["splash"]
    (_, ref), ref_grads = results["reference"]
    np.testing.assert_allclose(ours * real, ref * real, atol=2e-5)
    jax.tree.map(lambda ours, ref: np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4), our_grads, ref_grads)


def test_only_splash_takes_a_query_scaled_in_advance():
    q, k, v, attention_mask, _ = inputs(128, packed=False)
    config = config_lib.model_config("bert", attention_impl="xla", attention_probs_dropout_prob=0.0)
    mask = transformer.layer_mask(config, attention_mask, None, deterministic=True)
    with pytest.raises(ValueError, match="splash only"):
        transformer.dot_product_attention((q, k, v), mask, config, scaled_query=True)
