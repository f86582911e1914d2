"""InfoNCE over the global batch: on an 8-device mesh (data 4 x fsdp 2) the loss and its gradients equal those of one
device over the same batch, which per-device negatives would not give; the loss equals a direct numpy formula."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import config_lib, embed_train, modeling, sharding
from bert_jax.objectives import contrastive

BATCH, LENGTH = 16, 12


def numpy_info_nce(q, p, n, scale, symmetric):
    """-log softmax of each query's own positive among all positives (and negatives), by hand."""
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    q, p = unit(q), unit(p)
    candidates = p if n is None else np.concatenate([p, unit(n)])

    def cross_entropy(rows, columns):
        logits = scale * rows @ columns.T
        logits = logits - logits.max(-1, keepdims=True)
        return np.mean(np.log(np.exp(logits).sum(-1)) - np.diag(logits[:, :len(rows)]))

    loss = cross_entropy(q, candidates)
    return (loss + cross_entropy(p, q)) / 2 if symmetric else loss


@pytest.mark.parametrize("negatives,symmetric", [(False, False), (True, True)])
def test_info_nce_is_the_formula(negatives, symmetric):
    rng = np.random.default_rng(0)
    q, p, n = (rng.normal(size=(6, 8)).astype(np.float32) for _ in range(3))
    loss, metrics = contrastive.info_nce(q, p, n if negatives else None, scale=20.0, symmetric=symmetric)
    np.testing.assert_allclose(loss, numpy_info_nce(q, p, n if negatives else None, 20.0, symmetric), rtol=1e-5)
    assert metrics["loss"] == loss and 0 <= metrics["accuracy"] <= 1


@pytest.fixture(scope="module")
def encoder_and_params():
    config = config_lib.load_preset("embed", "tiny")
    with config.unlocked():
        config.model = config_lib.model_config("bert", vocab_size=128, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=32, embedding_size=32)
        config.symmetric = True
    encoder = modeling.backbone(config.model)
    return config, encoder, modeling.init_params(encoder, jax.random.key(0))


def pairs_batch(with_negative: bool) -> dict:
    rng = np.random.default_rng(1)
    batch = {}
    for field in ("query", "positive") + (("negative",) if with_negative else ()):
        lengths = rng.integers(3, LENGTH + 1, BATCH)
        mask = (np.arange(LENGTH) < lengths[:, None]).astype(np.int32)
        batch[f"{field}_input_ids"] = (rng.integers(5, 128, (BATCH, LENGTH)) * mask).astype(np.int32)
        batch[f"{field}_attention_mask"] = mask
    return batch


def test_sharded_loss_and_gradients_equal_one_device(encoder_and_params):
    config, encoder, params = encoder_and_params
    loss_fn = embed_train.contrastive_loss_fn(encoder, config)  # symmetric, with hard negatives
    loss = lambda p, b: loss_fn({"encoder": p}, b, jax.random.key(0), deterministic=True)[0]
    value_and_grad = lambda p, b: jax.value_and_grad(loss)(p, b)
    batch = pairs_batch(with_negative=True)

    one_device = jax.jit(value_and_grad)(params, batch)

    mesh = sharding.make_mesh(data=4, fsdp=2, tensor=1)
    boxed = modeling.abstract_params(encoder)
    param_shardings = sharding.mesh_shardings(boxed, mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    on_mesh = jax.jit(sharding.laid_out(value_and_grad, mesh), in_shardings=(param_shardings, batch_sharding))(
        jax.device_put(params, param_shardings), jax.device_put(batch, batch_sharding))
    assert len(jax.tree.leaves(on_mesh[1])[0].sharding.device_set) == 8
    np.testing.assert_allclose(on_mesh[0], one_device[0], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5), on_mesh[1], one_device[1])

    # Negatives from each device's 2 rows alone would give another loss: the mesh's loss is the global batch's.
    device_loss = jax.jit(loss)
    per_device = np.mean([device_loss(params, {k: v[i:i + 2] for k, v in batch.items()}) for i in range(0, BATCH, 2)])
    assert abs(per_device - float(on_mesh[0])) > 0.1


def test_learned_temperature_is_trained_and_not_decayed(encoder_and_params):
    config, encoder, _ = encoder_and_params
    with config.unlocked():
        config.learn_temperature = True
    from bert_jax import optimizer as optimizer_lib

    opt = config_lib.finetune_config("embed", 16, 16, 1e-2, 1.0).optimizer
    tx = optimizer_lib.make_optimizer(embed_train.finetune_lib.optimizer_config(opt, 10), 10)
    state = nn.unbox(embed_train.initial_state(encoder, tx, config, jax.random.key(0)))
    assert float(jnp.exp(state["temperature"]["scale"])) == pytest.approx(1 / config.temperature)
    schedule = lambda step: 1e-2
    step = jax.jit(lambda s, b: embed_train.contrastive_step(s, b, loss_fn=embed_train.contrastive_loss_fn(
        encoder, config), tx=tx, schedule=schedule))
    batch = pairs_batch(False)
    new_state, metrics = step(step(state, batch)[0], batch)  # the first step's learning rate is 0
    assert set(new_state) == set(state) and jax.tree.structure(new_state["params"]) == jax.tree.structure(
        state["params"])
    assert float(new_state["temperature"]["scale"]) != float(state["temperature"]["scale"])
    assert metrics["logit_scale"] == pytest.approx(20.0, rel=1e-3)
    assert optimizer_lib.weight_decay_mask(embed_train.trainable(state))["temperature"]["scale"] is False
