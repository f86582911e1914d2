"""Objectives, optimizer and gradient accumulation on small hand-made inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib, objectives, optimizer, train
from bert_jax.modeling import init_params, pretraining_model
from bert_jax.objectives import mlm, rtd, sentence_pair


def log_softmax(x):
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_masked_lm_averages_over_real_predictions_only():
    logits = np.random.RandomState(0).randn(2, 3, 7).astype(np.float32)
    batch = {"masked_lm_ids": np.array([[1, 2, 3], [4, 5, 0]]), "masked_lm_weights": np.array([[1, 1, 1], [1, 1, 0]])}
    loss, metrics = mlm.masked_lm(jnp.asarray(logits), batch)
    nll = -np.take_along_axis(log_softmax(logits), batch["masked_lm_ids"][..., None], -1)[..., 0]
    np.testing.assert_allclose(loss, nll[batch["masked_lm_weights"] > 0].mean(), rtol=1e-6)
    hits = logits.argmax(-1) == batch["masked_lm_ids"]
    np.testing.assert_allclose(metrics["mlm_accuracy"], hits[batch["masked_lm_weights"] > 0].mean(), rtol=1e-6)
    empty = {**batch, "masked_lm_weights": np.zeros((2, 3))}
    assert float(mlm.masked_lm(jnp.asarray(logits), empty)[0]) == 0.0


@pytest.mark.parametrize("task,key", [("nsp", "next_sentence_labels"), ("sop", "sentence_order_labels")])
def test_sentence_pair_reads_its_own_labels(task, key):
    logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    loss, metrics = sentence_pair.sentence_pair(logits, {key: jnp.array([0, 1, 1])}, task)
    assert set(metrics) == {f"{task}_loss", f"{task}_accuracy"}
    np.testing.assert_allclose(metrics[f"{task}_accuracy"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(loss, np.mean([np.log1p(np.exp(-2.0))] * 2 + [np.log1p(np.exp(2.0))]), rtol=1e-6)


RTD_BATCH = {
    "input_ids": jnp.array([[2, 4, 11, 4, 3, 0]]),  # [CLS] [MASK] w [MASK] [SEP] pad
    "input_mask": jnp.array([[1, 1, 1, 1, 1, 0]]),
    "masked_lm_positions": jnp.array([[1, 3, 0]]),
    "masked_lm_ids": jnp.array([[20, 30, 0]]),
    "masked_lm_weights": jnp.array([[1, 1, 0]]),
}


def test_corruption_writes_real_predictions_only_and_counts_reproduced_tokens_as_original():
    corrupted, labels = rtd.corrupt(RTD_BATCH, jnp.array([[20, 31, 99]]))  # reproduces 20, replaces 30; pad slot 99
    np.testing.assert_array_equal(corrupted, [[2, 20, 11, 31, 3, 0]])  # position 0 ([CLS]) untouched by padding
    np.testing.assert_array_equal(labels, [[0, 0, 0, 1, 0, 0]])


def test_discriminator_metrics_ignore_padding():
    logits = jnp.array([[-5.0, 5.0, 5.0, -5.0, -5.0, 5.0]])
    labels = jnp.array([[0, 1, 0, 1, 0, 1]])
    _, metrics = rtd.discriminator_metrics(logits, labels, RTD_BATCH["input_mask"])
    np.testing.assert_allclose(metrics["rtd_accuracy"], 3 / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["rtd_precision"], 1 / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["rtd_recall"], 1 / 2, rtol=1e-6)


def test_generator_gets_no_gradient_from_the_discriminator():
    """The sampling is under stop-gradient: d total / d generator logits is the generator MLM's gradient alone."""
    gen_logits = jax.random.normal(jax.random.key(0), (1, 3, 40))
    disc = lambda ids: jnp.sin(ids.astype(jnp.float32))  # noqa: E731  any function of the sampled ids

    def total(logits):
        return rtd.replaced_token_detection(lambda b: logits, disc, RTD_BATCH, jax.random.key(1), weight=50.0)[0]

    def generator_only(logits):
        return mlm.masked_lm(logits, RTD_BATCH)[0]

    np.testing.assert_allclose(jax.grad(total)(gen_logits), jax.grad(generator_only)(gen_logits), atol=1e-7)


def test_gumbel_sampling_follows_the_softmax():
    logits = jnp.log(jnp.array([0.7, 0.2, 0.1]))
    samples = jax.vmap(lambda k: rtd.sample_tokens(logits, k))(jax.random.split(jax.random.key(0), 4000))
    np.testing.assert_allclose(np.bincount(samples, minlength=3) / 4000, [0.7, 0.2, 0.1], atol=0.03)


def test_electra_loss_trains_the_shared_embeddings_from_both_models():
    config = config_lib.load_preset("electra", "tiny")
    model = pretraining_model(config)
    params = init_params(model, jax.random.key(0))
    assert "embeddings" in params and "embeddings" not in params["generator"]
    batch = {**RTD_BATCH, "segment_ids": jnp.zeros((1, 6), jnp.int32)}
    loss = objectives.loss_fn(config, model)
    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=3)
    (total, metrics), grads = grad_fn(params, batch, jax.random.key(1), True)
    np.testing.assert_allclose(total, metrics["generator_loss"] + 50.0 * metrics["rtd_loss"], rtol=1e-6)
    assert {"generator_accuracy", "rtd_accuracy", "rtd_precision", "rtd_recall"} <= set(metrics)
    assert float(jnp.abs(grads["embeddings"]["word_embeddings"]["embedding"]).sum()) > 0
    assert float(jnp.abs(grads["discriminator_head"]["prediction"]["kernel"]).sum()) > 0


def test_optimizer_skips_decay_on_biases_and_layernorm_and_schedules_warmup_then_decay():
    config = config_lib.load_preset("bert", "tiny")
    params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}, "norm": {"scale": jnp.ones(2)}}
    assert optimizer.weight_decay_mask(params) == {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False}}
    config.optimizer.warmup_steps = 10
    schedule = optimizer.learning_rate_schedule(config.optimizer, 110)
    lr = config.optimizer.learning_rate
    np.testing.assert_allclose([schedule(0), schedule(5), schedule(10), schedule(60), schedule(110)],
                               [0, lr / 2, lr, lr / 2, 0], rtol=1e-5, atol=1e-9)
    for name in optimizer.OPTIMIZERS:
        config.optimizer.name = name
        tx = optimizer.make_optimizer(config.optimizer, 110)
        updates, _ = tx.update(params, tx.init(params), params)
        assert jax.tree.structure(updates) == jax.tree.structure(params)
    config.optimizer.name = "sgd"
    with pytest.raises(optimizer.OptimizerConfigError, match="config.optimizer.name='sgd'"):
        optimizer.validate(config.optimizer, 110, 32)


def test_gradient_accumulation_averages_micro_batches():
    def loss(w, batch, rng):
        err = batch["x"] @ w - batch["y"]
        return jnp.mean(err ** 2), {"loss": jnp.mean(err ** 2)}

    rs = np.random.RandomState(0)
    batch = {"x": jnp.asarray(rs.randn(8, 3), jnp.float32), "y": jnp.asarray(rs.randn(8), jnp.float32)}
    w = jnp.ones(3)
    metrics1, grads1 = train.gradients(loss, w, batch, jax.random.key(0), 1)
    metrics4, grads4 = train.gradients(loss, w, batch, jax.random.key(0), 4)
    np.testing.assert_allclose(grads4, grads1, rtol=1e-5)
    np.testing.assert_allclose(metrics4["loss"], metrics1["loss"], rtol=1e-5)
