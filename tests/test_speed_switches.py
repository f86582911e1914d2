"""Speed switches of the step compute the same thing: attention kernels, buffer donation, the compilation cache.

(The gathered MLM head, packing, bfloat16, scan and remat have their equivalence tests beside the models.)
"""
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import config_lib, modeling, objectives, optimizer, train
from bert_jax.modeling import pretraining_model, transformer
from bert_jax.modeling.transformer import attention_kernel, attention_mask_for, dot_product_attention, in_lanes
from train_helpers import as_users_compile, global_batch_at, tiny_config


@pytest.mark.parametrize("impl, cache_bytes",
                         [("auto", None), ("auto", 2 * 4 * 12 * 12 * 4), ("xla", None), ("reference", None)])
def test_fused_attention_and_its_gradients_equal_the_reference(impl, cache_bytes, monkeypatch):
    """cache_bytes: cpu_attention (auto on CPU) looping over 2 of the 3 examples at a time (the logits of 2 x 4 heads
    x 12 x 12), then the last one."""
    if cache_bytes:
        monkeypatch.setattr(transformer, "CPU_ATTENTION_BYTES", cache_bytes)
    config = config_lib.load_preset("bert", "tiny").model
    config.attention_impl = impl
    q, k, v = jax.random.normal(jax.random.key(0), (3, 3, 12, 4, 16))
    mask = attention_mask_for(jnp.ones((3, 12)).at[1, 7:].set(0), jnp.array([[1] * 5 + [2] * 7, [1] * 12, [1] * 12]))

    def value_and_grads(attention):
        return jax.value_and_grad(lambda q, k, v: (attention(q, k, v) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)

    stacked = lambda q, k, v: jnp.stack([in_lanes(x) for x in (q, k, v)])  # as the layers' projection writes them
    ours = value_and_grads(lambda q, k, v: dot_product_attention(stacked(q, k, v), mask, config))
    reference = value_and_grads(lambda q, k, v: nn.dot_product_attention(q, k, v, mask=mask))
    for got, expected in zip(jax.tree.leaves(ours), jax.tree.leaves(reference)):
        np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)


def test_attention_kernel_rule():
    def kernel(impl, dropout, deterministic):
        config = config_lib.load_preset("bert", "tiny").model
        config.update(attention_impl=impl, attention_probs_dropout_prob=dropout)
        return attention_kernel(config, deterministic)

    assert kernel("auto", 0.1, deterministic=False) == "reference"  # only the reference has attention dropout
    assert kernel("auto", 0.1, deterministic=True) == "auto"  # evaluation and inference stay fused
    assert kernel("auto", 0.0, deterministic=False) == "auto"
    assert kernel("reference", 0.0, deterministic=True) == "reference"
    assert kernel("cudnn", 0.0, deterministic=False) == "cudnn"
    with pytest.raises(config_lib.ConfigError, match="attention_impl='xla': this fused kernel has no attention"):
        kernel("xla", 0.1, deterministic=False)


def test_training_without_attention_dropout_runs_fused_and_matches_the_reference(monkeypatch):
    config = config_lib.load_preset("bert", "tiny")
    config.model.update(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    ids = jax.random.randint(jax.random.key(1), (2, 16), 5, 1000)
    mask = jnp.ones_like(ids).at[1, 10:].set(0)
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=jnp.zeros_like(ids))
    params = modeling.init_params(pretraining_model(config), jax.random.key(0))
    fused_calls = []
    fused = transformer.cpu_attention  # auto's kernel on CPU off a mesh
    monkeypatch.setattr(transformer, "cpu_attention", lambda *a, **k: fused_calls.append(1) or fused(*a, **k))

    def training_logits(impl):
        config.model.attention_impl = impl
        return pretraining_model(config).apply({"params": params}, **inputs, deterministic=False,
                                               rngs={"dropout": jax.random.key(2)})["mlm_logits"]

    fused_logits = training_logits("auto")
    assert len(fused_calls) == config.model.num_hidden_layers
    reference_logits = training_logits("reference")
    assert len(fused_calls) == config.model.num_hidden_layers
    np.testing.assert_allclose(fused_logits, reference_logits, atol=1e-5)


def test_donated_step_matches_and_frees_the_old_state():
    config = config_lib.load_preset("bert", "tiny")
    model = pretraining_model(config)
    tx = optimizer.make_optimizer(config.optimizer, config.total_steps)
    step = functools.partial(train.train_step, loss_fn=objectives.loss_fn(config, model), tx=tx,
                             schedule=optimizer.learning_rate_schedule(config.optimizer, config.total_steps),
                             accum_steps=1)
    init = jax.jit(lambda rng: nn.unbox(train.initial_state(model, tx, rng)))
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 2000, (4, 32)).astype(np.int32)
    batch = dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
                 masked_lm_positions=np.tile(np.arange(1, 6, dtype=np.int32), (4, 1)), masked_lm_ids=ids[:, 1:6],
                 masked_lm_weights=np.ones((4, 5), np.int32), next_sentence_labels=np.zeros(4, np.int32))
    # The suite's XLA:CPU emitters (tests/conftest.py) group a step's fusions differently when its outputs alias its
    # inputs, so the two programs would round differently (1e-12 apart): compile both as a user's run does.
    kept, _ = as_users_compile(jax.jit(step), init(jax.random.key(0)), batch)
    donated_input = init(jax.random.key(0))
    donated, _ = as_users_compile(jax.jit(step, donate_argnums=0), donated_input, batch)
    jax.tree.map(np.testing.assert_array_equal, donated, kept)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(donated_input["params"]))


def test_non_finite_step_leaves_the_state_exactly_as_it_was():
    config = tiny_config("bert")
    model = pretraining_model(config)
    tx = optimizer.make_optimizer(config.optimizer, config.total_steps)
    step = jax.jit(functools.partial(train.train_step, loss_fn=objectives.loss_fn(config, model), tx=tx,
                                     schedule=optimizer.learning_rate_schedule(config.optimizer, config.total_steps),
                                     accum_steps=1))
    state = jax.jit(lambda rng: nn.unbox(train.initial_state(model, tx, rng)))(jax.random.key(0))
    state, metrics = step(state, global_batch_at(config, 0, weights_dtype=np.float32))
    assert bool(metrics["finite"])
    poisoned = global_batch_at(config, 1, weights_dtype=np.float32)
    poisoned["masked_lm_weights"][0, 0] = np.nan
    after, metrics = step(state, poisoned)
    assert not bool(metrics["finite"]) and int(after["step"]) == int(state["step"]) + 1
    jax.tree.map(np.testing.assert_array_equal, (after["params"], after["opt_state"]),
                 (state["params"], state["opt_state"]))


def test_compilation_cache_is_written_and_reused(tmp_path):
    program = f"""
import time, jax, jax.numpy as jnp
from bert_jax import train
train.enable_compilation_cache({str(tmp_path)!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
print(float(f(jnp.ones((64, 64)))))
"""
    run = lambda: subprocess.run([sys.executable, "-c", program], check=True, capture_output=True, text=True,
                                 env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    first = run()
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries, "nothing was cached"
    assert run() == first and sorted(p.name for p in tmp_path.iterdir()) == entries  # hit: no new entry
