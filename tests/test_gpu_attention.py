"""cuDNN attention's inputs on the CPU (bert_jax.modeling.gpu_attention): padding as key lengths and ModernBERT's
windows against the reference attention, forward and backward, and the model wired to them when traced for a GPU.

The CPU has no cuDNN: the wiring tests trace for "gpu" and run jax.nn.dot_product_attention's XLA implementation
where the model asks for cuDNN, with the very arguments it gave (the lengths, the window). tests/test_gpu_compile.py
compiles the same for an H200 and finds the cuDNN kernels in the executable.
"""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import config_lib, families, modeling, sharding
from bert_jax.modeling import gpu_attention, transformer

SEQ, HEADS, WIDTH = 24, 2, 16


def rows():
    """q, k, v [3, S, heads, d] and their padding: row 0 full, row 1 with 9 padding tokens, row 2 padding only."""
    q, k, v = jax.random.normal(jax.random.key(0), (3, 3, SEQ, HEADS, WIDTH), jnp.float32)
    attention_mask = np.ones((3, SEQ), np.int32)
    attention_mask[1, -9:] = 0
    attention_mask[2] = 0
    return q, k, v, jnp.asarray(attention_mask)


def test_key_lengths_count_the_real_tokens_and_at_least_one():
    _, _, _, attention_mask = rows()
    np.testing.assert_array_equal(gpu_attention.key_lengths(attention_mask), [SEQ, SEQ - 9, 1])
    assert gpu_attention.key_lengths(attention_mask).dtype == jnp.int32  # what jax.nn.dot_product_attention takes


@pytest.mark.parametrize("half_window", [None, 4])
def test_lengths_and_windows_match_the_reference_forward_and_backward(half_window):
    q, k, v, attention_mask = rows()
    lengths = gpu_attention.key_lengths(attention_mask)
    mask = transformer.attention_mask_for(attention_mask.at[2, 0].set(1), None)  # the padding row sees token 0
    if half_window is not None:
        mask = transformer.window_mask(mask, half_window)
    weights = jax.random.normal(jax.random.key(1), q.shape)

    def loss(attention, q, k, v):
        return jnp.sum(attention(q, k, v) * weights)

    fused = lambda q, k, v: gpu_attention.attend(q, k, v, lengths, half_window, implementation="xla")  # noqa: E731
    reference = lambda q, k, v: nn.dot_product_attention(q, k, v, mask=mask)  # noqa: E731
    # Every query, padding ones too, sees what it sees under the reference: all outputs compare.
    np.testing.assert_allclose(fused(q, k, v), reference(q, k, v), atol=1e-6)
    fused_grads = jax.grad(lambda *x: loss(fused, *x), argnums=(0, 1, 2))(q, k, v)
    reference_grads = jax.grad(lambda *x: loss(reference, *x), argnums=(0, 1, 2))(q, k, v)
    for got, expected in zip(fused_grads, reference_grads):
        np.testing.assert_allclose(got, expected, atol=1e-5)


def model_config(family: str, **overrides):
    config = config_lib.load_preset(family, "tiny").model
    config.update({"dtype": "bfloat16", "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0, **overrides})
    return config


def test_auto_runs_cudnn_on_a_gpu_where_dtype_and_head_width_allow(monkeypatch, caplog):
    monkeypatch.setattr(sharding, "target_platform", lambda: "gpu")
    monkeypatch.setattr(gpu_attention, "_logged", set())
    kernel = lambda config, deterministic=False: transformer.attention_kernel(config, deterministic)  # noqa: E731
    assert kernel(model_config("bert")) == "cudnn"
    assert kernel(model_config("bert", attention_probs_dropout_prob=0.1)) == "reference"  # cuDNN: no dropout here
    assert kernel(model_config("bert", attention_probs_dropout_prob=0.1), deterministic=True) == "cudnn"
    assert kernel(model_config("bert", attention_impl="xla")) == "xla"
    with caplog.at_level(logging.INFO):
        assert kernel(model_config("bert", dtype="float32")) == "auto"  # XLA's attention
        assert kernel(model_config("bert", hidden_size=60, num_attention_heads=4)) == "auto"  # head width 15
        kernel(model_config("bert", dtype="float32"))
    fallbacks = [record.getMessage() for record in caplog.records if "attention:" in record.getMessage()]
    assert fallbacks == ["attention: XLA's attention, not cuDNN: config.model.dtype=float32: cuDNN's fused "
                         "attention takes bfloat16 or float16",
                         "attention: XLA's attention, not cuDNN: head width 15: cuDNN's fused attention takes "
                         "multiples of 8 up to 128"]  # once each


def traced_for_gpu(monkeypatch) -> list[dict]:
    """Trace as for a GPU and run cuDNN's calls with XLA's implementation; returns each call's arguments."""
    monkeypatch.setattr(sharding, "target_platform", lambda: "gpu")
    calls, attention = [], jax.nn.dot_product_attention

    def on_cpu(query, key, value, bias=None, mask=None, **kwargs):
        calls.append({"mask": mask, **kwargs})
        if kwargs.get("implementation") == "cudnn":
            kwargs["implementation"] = "xla"
        return attention(query, key, value, bias, mask, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", on_cpu)
    return calls


def logits(config, impl: str, params, ids, attention_mask, packing=None):
    config.attention_impl = impl
    return modeling.PreTrainingModel(config, sentence_head=False).apply(
        {"params": params}, ids, attention_mask, packing_segment_ids=packing)["mlm_logits"]


def padded_batch():
    ids = jax.random.randint(jax.random.key(1), (2, SEQ), 5, 500)
    return ids, jnp.ones_like(ids).at[1, 15:].set(0)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_padded_batch_reaches_cudnn_as_lengths_and_matches_the_reference(family, monkeypatch):
    config = model_config(family)
    ids, attention_mask = padded_batch()
    params = modeling.init_params(modeling.PreTrainingModel(config, sentence_head=False), jax.random.key(0))
    reference = logits(config, "reference", params, ids, attention_mask)
    calls = traced_for_gpu(monkeypatch)
    fused = logits(config, "auto", params, ids, attention_mask)

    half_window = families.of(config).attention_half_window
    windows = [half_window(config, layer) if half_window else None for layer in range(config.num_hidden_layers)]
    assert [call["implementation"] for call in calls] == ["cudnn" if w is None else "xla" for w in windows]
    assert [call["local_window_size"] for call in calls] == windows  # ModernBERT: global, local, local
    for call in calls:
        assert call["mask"] is None  # no [B, S, S] array reaches either kernel
        np.testing.assert_array_equal(call["key_value_seq_lengths"], [SEQ, 15])
    real = np.asarray(attention_mask, bool)
    np.testing.assert_allclose(np.asarray(fused, np.float32)[real], np.asarray(reference, np.float32)[real],
                               atol=2e-2)


def test_packed_rows_fall_back_to_xla_with_the_mask_and_say_so(monkeypatch, caplog):
    config = model_config("modernbert")
    ids, attention_mask = padded_batch()
    packing = jnp.where(jnp.arange(SEQ) < 10, 1, 2)[None].repeat(2, 0) * attention_mask
    params = modeling.init_params(modeling.PreTrainingModel(config, sentence_head=False), jax.random.key(0))
    reference = logits(config, "reference", params, ids, attention_mask, packing)
    calls = traced_for_gpu(monkeypatch)
    monkeypatch.setattr(gpu_attention, "_logged", set())
    with caplog.at_level(logging.INFO):
        fused = logits(config, "auto", params, ids, attention_mask, packing)
    assert [call["implementation"] for call in calls] == [None] * config.num_hidden_layers  # XLA's attention
    assert all(call["mask"].shape == (2, 1, SEQ, SEQ) for call in calls)
    assert [r.getMessage() for r in caplog.records if "attention:" in r.getMessage()] == [
        "attention: XLA's attention for packed rows: jax.nn.dot_product_attention gives cuDNN no segment ids"]
    real = np.asarray(attention_mask, bool)
    np.testing.assert_allclose(np.asarray(fused, np.float32)[real], np.asarray(reference, np.float32)[real],
                               atol=2e-2)
