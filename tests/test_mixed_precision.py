"""bfloat16 compute: float32 master weights, float32 softmax / LayerNorm statistics / losses, results close to float32.

Tolerances are bfloat16's: 8 significand bits, a relative rounding step of 2^-8 ~ 0.4% per operation.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import config_lib, modeling, objectives, optimizer, train
from bert_jax.modeling.transformer import (ONE_HOT_ROWS, attention_mask_for, bfloat16_matmul, dot_product_attention,
                                           float32_summed_bias, layer_norm, lookup)
from train_helpers import global_batch_at, tiny_config


def tiny_model(family="bert", **overrides):
    config = config_lib.load_preset(family, "tiny").model
    config.update(overrides)
    return config


@pytest.mark.parametrize("family", ["bert", "albert", "electra"])
def test_bfloat16_compute_keeps_float32_master_weights(family):
    config = config_lib.load_preset(family, "tiny")
    config.model.dtype = "bfloat16"
    params = modeling.init_params(modeling.pretraining_model(config), jax.random.key(0))
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    config.model.param_dtype = "bfloat16"
    params = modeling.init_params(modeling.pretraining_model(config), jax.random.key(0))
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_layer_norm_statistics_stay_float32():
    # A large common offset: a bfloat16 mean/variance would cancel to garbage, float32 statistics do not.
    x = (1000.0 + jax.random.normal(jax.random.key(0), (4, 64))).astype(jnp.bfloat16)
    norm = layer_norm(tiny_model(dtype="bfloat16"), "embed", "norm")
    params = norm.init(jax.random.key(1), x)
    y = norm.apply(params, x)
    assert y.dtype == jnp.bfloat16
    x32 = x.astype(jnp.float32)
    expected = (x32 - x32.mean(-1, keepdims=True)) / jnp.sqrt(x32.var(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(y.astype(jnp.float32), expected, atol=0.02)


@pytest.mark.parametrize("rows", [2, ONE_HOT_ROWS, ONE_HOT_ROWS + 1])
def test_embedding_gradients_count_every_token_under_bfloat16(rows):
    # 4,096 tokens of one id: a bfloat16 accumulator stops growing at 256 (256 + 1 rounds back to 256), so the
    # small tables' gradient (token types: every token adds into one of 2 rows) must sum in float32. The word
    # table (over ONE_HOT_ROWS) keeps the gather, whose rows take few updates each: a few tokens per row there.
    table = nn.Embed(rows, 8, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    ids = jnp.zeros((4, 1024), jnp.int32) if rows <= ONE_HOT_ROWS else jnp.arange(4 * 1024).reshape(4, 1024) % rows
    params = table.init(jax.random.key(0), ids)
    read = lambda params: table.apply(params, ids, method=lambda module, ids: lookup(module, ids))  # noqa: E731
    np.testing.assert_array_equal(read(params), params["params"]["embedding"].astype(jnp.bfloat16)[ids])  # exact
    grads = jax.grad(lambda p: read(p).astype(jnp.float32).sum())(params)["params"]["embedding"]
    np.testing.assert_array_equal(grads[:, 0], np.bincount(np.asarray(ids).ravel(), minlength=rows))


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_attention_softmax_is_float32_under_bfloat16(impl):
    # Large logits with small differences: a bfloat16 softmax input would round them together.
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 12, 4, 16)) * jnp.array([4.0, 4.0, 1.0])[:, None, None,
                                                                                                   None, None]
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    mask = attention_mask_for(jnp.ones((2, 12)).at[1, 7:].set(0), None)
    expected = nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask=mask)
    got = dot_product_attention((q, k, v), mask, tiny_model(dtype="bfloat16", attention_impl=impl))
    assert got.dtype == jnp.bfloat16
    # Only the bfloat16 probabilities times V round; logits of ~30 in bfloat16 would be off by up to 0.125.
    np.testing.assert_allclose(got.astype(jnp.float32), expected, atol=0.03)


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_bfloat16_outputs_agree_with_float32(family):
    config32 = config_lib.load_preset(family, "tiny")
    config16 = config_lib.load_preset(family, "tiny")
    config16.model.dtype = "bfloat16"
    params = modeling.init_params(modeling.pretraining_model(config32), jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (2, 16), 5, 1000)
    inputs = dict(input_ids=ids, attention_mask=jnp.ones_like(ids).at[1, 10:].set(0),
                  token_type_ids=jnp.zeros_like(ids))
    out32 = modeling.pretraining_model(config32).apply({"params": params}, **inputs)
    out16 = modeling.pretraining_model(config16).apply({"params": params}, **inputs)
    for key in ("mlm_logits", "discriminator_logits", "sentence_logits"):
        if key in out32:
            assert out16[key].dtype == jnp.float32, key  # what the losses see
            scale = float(jnp.abs(out32[key]).max())
            np.testing.assert_allclose(out16[key], out32[key], atol=0.02 * scale, err_msg=key)


def test_bfloat16_matmul_rounds_and_differentiates_as_a_bfloat16_dot():
    keys = jax.random.split(jax.random.key(0), 3)
    lhs, rhs, grad = (jax.random.normal(key, shape).astype(jnp.bfloat16)
                      for key, shape in zip(keys, [(64, 96), (96, 80), (64, 80)]))
    dot = lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())))  # noqa: E731
    ours, ours_vjp = jax.vjp(bfloat16_matmul, lhs, rhs)
    plain, plain_vjp = jax.vjp(dot, lhs, rhs)
    assert ours.dtype == plain.dtype == jnp.bfloat16
    # The same float32 sums in another order, each rounded once to bfloat16: at most one rounding step apart.
    for got, want in zip((ours, *ours_vjp(grad)), (plain, *plain_vjp(grad)), strict=True):
        assert got.dtype == want.dtype
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7 * float(np.abs(want).max()) * 1e-2)


def bfloat16_step_equations(primitive: str):
    """The `primitive` equations of a tiny bfloat16 BERT's loss gradient, traced for the CPU, with the number of
    tokens in its batch, the rows its last layer computes (the masked positions and [CLS]: OutputRows) and its
    number of layers."""
    config = tiny_config("bert", **{"model.dtype": "bfloat16"})
    model = modeling.pretraining_model(config)
    params = modeling.init_params(model, jax.random.key(0))
    loss = objectives.loss_fn(config, model)
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss(p, global_batch_at(config, 0), jax.random.key(0), True)[0]))(params)

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from walk(sub)
            if eqn.primitive.name == primitive:
                yield eqn

    rows = config.data.batch_size * (config.masking.max_predictions_per_seq + 1)
    return (list(walk(jaxpr.jaxpr)), config.data.batch_size * config.data.seq_length, rows,
            config.model.num_hidden_layers)


def test_cpu_layer_matmuls_of_a_bfloat16_step_ask_for_float32_sums():
    """XLA:CPU runs a bfloat16 dot with a bfloat16 result, or with its lhs transposed, in its float32 kernel, so each
    matmul of a layer (Q, K, V, the attention output and the FFN, forward and backward) asks for float32 sums with
    the lhs's contracted axis last (bfloat16_matmul)."""
    dots, tokens, rows, layers = bfloat16_step_equations("dot_general")
    matmuls = [(tuple(v.aval.dtype for v in eqn.invars), eqn.outvars[0].aval.dtype,
                eqn.params["dimension_numbers"][0][0])
               for eqn in dots if {tokens, rows} & set(eqn.invars[0].aval.shape)]  # over merged [B x S or P, ...]
    # forward, input and weight gradient of 4 each; the last layer's query and its keys and values apart (5)
    assert len(matmuls) == 3 * (4 * layers + 1)
    bfloat16, float32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
    assert set(matmuls) == {((bfloat16, bfloat16), float32, (1,))}


def test_cpu_bias_gradients_of_a_bfloat16_step_sum_in_float32():
    """Autodiff's sum of a bfloat16 bias gradient reaches XLA:CPU as a bfloat16 reduction, which it converts and sums
    in passes of its own: each layer's four biases (Q, K, V's stacked, the attention output's and the FFN's) get
    their gradient summed over the tokens in float32 instead (float32_summed_bias)."""
    sums, tokens, rows, layers = bfloat16_step_equations("reduce_sum")
    over_tokens = [eqn.invars[0].aval.dtype for eqn in sums  # or over the last layer's rows
                   if np.prod([eqn.invars[0].aval.shape[axis] for axis in eqn.params["axes"]]) in (tokens, rows)]
    assert over_tokens.count(jnp.dtype(jnp.float32)) >= 4 * layers
    assert jnp.dtype(jnp.bfloat16) not in over_tokens

    x, bias, grad = (jax.random.normal(key, shape).astype(jnp.bfloat16)
                     for key, shape in zip(jax.random.split(jax.random.key(0), 3), [(4, 64, 8), (1, 1, 8), (4, 64, 8)]))
    _, vjp = jax.vjp(float32_summed_bias, x, bias)
    expected = np.asarray(grad, np.float32).sum((0, 1), keepdims=True)
    np.testing.assert_allclose(np.asarray(vjp(grad)[1], np.float32), expected, rtol=2 ** -8)


def test_weights_read_once_keep_their_gradients_near_float32():
    """The trainer casts ALBERT's shared layer and the tied word table to bfloat16 once for all their uses
    (train.shared_weights_read_once), so their gradients are summed over the uses in bfloat16: hardly further from
    float32's than with a cast per use (the shared layer at 12 layers: 0.94% against 0.86%)."""
    overrides = {"model.num_hidden_layers": 8, "model.num_hidden_groups": 1, "model.scan_layers": True,
                 "model.hidden_dropout_prob": 0.0, "data.batch_size": 16}
    config32 = tiny_config("albert", **overrides)
    config16 = tiny_config("albert", **overrides, **{"model.dtype": "bfloat16"})
    params = modeling.init_params(modeling.pretraining_model(config32), jax.random.key(0))
    batch = global_batch_at(config32, 0)
    one_device = train.sharding.replicated(train.sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    shardings = jax.tree.map(lambda _: one_device, params)

    def shared_gradients(config, read_once):
        loss = objectives.loss_fn(config, modeling.pretraining_model(config))
        read = functools.partial(train.shared_weights_read_once, model_config=config.model, param_shardings=shardings)
        grads = jax.jit(jax.grad(lambda p: loss(read(p) if read_once else p, batch, jax.random.key(0), True)[0]))(
            params)
        layer = grads["backbone"]["encoder"]["layer_0"]
        return {"shared layer": [layer[name]["kernel"] for name in ("query", "attention_output", "intermediate",
                                                                    "output")],
                "word table": [grads["backbone"]["embeddings"]["word_embeddings"]["embedding"]]}

    def errors(grads):
        return {weight: max(float(jnp.linalg.norm(g - r) / jnp.linalg.norm(r)) for g, r in zip(grads[weight], ref))
                for weight, ref in reference.items()}

    reference = shared_gradients(config32, read_once=False)
    per_use, once = (errors(shared_gradients(config16, read_once)) for read_once in (False, True))
    for weight in reference:
        assert once[weight] <= 1.25 * per_use[weight] and once[weight] < 0.03, (weight, once, per_use)


def run_steps(config, steps: int):
    model = modeling.pretraining_model(config)
    tx = optimizer.make_optimizer(config.optimizer, config.total_steps)
    step = jax.jit(functools.partial(train.train_step, loss_fn=objectives.loss_fn(config, model), tx=tx,
                                     schedule=optimizer.learning_rate_schedule(config.optimizer, config.total_steps),
                                     accum_steps=1))
    state = jax.jit(lambda rng: nn.unbox(train.initial_state(model, tx, rng)))(jax.random.key(0))
    losses = []
    for i in range(steps):
        state, metrics = step(state, global_batch_at(config, i))
        losses.append(float(metrics["loss"]))
    return state, np.array(losses)


def test_bfloat16_training_follows_float32():
    config32 = tiny_config("bert", total_steps=6)
    config16 = tiny_config("bert", total_steps=6, **{"model.dtype": "bfloat16"})
    state32, losses32 = run_steps(config32, 6)
    state16, losses16 = run_steps(config16, 6)
    assert np.isfinite(losses16).all()
    assert {leaf.dtype for leaf in jax.tree.leaves(state16["params"])} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(losses16, losses32, rtol=0.01)
    assert losses16[-1] < losses16[0]  # it learns, not just agrees
