"""bert_jax.optimizer: StableAdamW step by step against torch-optimi, every schedule against its formula, the
weight-decay mask, a schedule restarted for a new phase, and the errors that name a key."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config_lib, optimizer

SHAPES = {"dense": {"kernel": (6, 4), "bias": (4,)}, "norm": {"scale": (4,)}, "embeddings": {"embedding": (10, 4)}}
STEPS, PEAK = 20, 1e-2


def optimizer_config(**settings):
    opt = config_lib.load_preset("modernbert", "tiny").optimizer
    opt.update(settings)
    return opt


def gradients_at(step: int, params: dict, rs) -> dict:
    """Random gradients, with a spike on the kernel every 7th step: a large g^2 / v trips StableAdamW's clipping."""
    grads = jax.tree.map(lambda p: rs.randn(*p.shape).astype(np.float32), params)
    if step % 7 == 6:
        grads["dense"]["kernel"] *= 30.0
    return grads


def optimi_run(params: dict, grads: list, rates: list, decays: dict, opt) -> dict:
    """torch-optimi's StableAdamW over the same gradients and rates; decayed and undecayed tensors in two groups."""
    import torch
    from optimi import StableAdamW

    flat = {path: torch.tensor(np.asarray(x)) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    flat = {jax.tree_util.keystr(path): t.requires_grad_() for path, t in flat.items()}
    groups = [{"params": [t for k, t in flat.items() if decays[k] == wd], "weight_decay": opt.weight_decay * wd}
              for wd in (True, False)]
    torch_opt = StableAdamW(groups, lr=rates[0], betas=(opt.b1, opt.b2), eps=opt.eps,
                            decouple_lr=opt.fully_decoupled_weight_decay, max_lr=opt.learning_rate,
                            foreach=False, triton=False)
    for step_grads, rate in zip(grads, rates):
        for path, g in jax.tree_util.tree_flatten_with_path(step_grads)[0]:
            flat[jax.tree_util.keystr(path)].grad = torch.tensor(g)
        for group in torch_opt.param_groups:
            group["lr"] = rate
        torch_opt.step()
    return {k: t.detach().numpy() for k, t in flat.items()}


@pytest.mark.parametrize("fully_decoupled", [True, False])
def test_stable_adamw_matches_torch_optimi_for_20_steps(fully_decoupled):
    opt = optimizer_config(learning_rate=PEAK, warmup_steps=5, weight_decay=1e-2 if fully_decoupled else 1.0,
                           fully_decoupled_weight_decay=fully_decoupled, grad_clip_norm=0.0)
    rs = np.random.RandomState(0)
    params = jax.tree.map(lambda s: rs.randn(*s).astype(np.float32), SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    grads = [gradients_at(step, params, rs) for step in range(STEPS)]
    schedule = optimizer.learning_rate_schedule(opt, STEPS)
    rates = [float(schedule(step)) for step in range(STEPS)]
    tx = optimizer.make_optimizer(opt, STEPS)
    state, ours = tx.init(params), params
    update = jax.jit(tx.update)
    clipped = 0
    for step_grads in grads:
        updates, state = update(step_grads, state, ours)
        ours = optax.apply_updates(ours, updates)
        clipped += int(np.max(optimizer.update_rms(jnp.asarray(step_grads["dense"]["kernel"]),
                                                   state[0].nu["dense"]["kernel"], opt.eps, False)) > 1)
    assert clipped >= 2  # the comparison covers clipped steps
    decays = {jax.tree_util.keystr(p): m for p, m in
              jax.tree_util.tree_flatten_with_path(optimizer.weight_decay_mask(params))[0]}
    assert decays == {"['dense']['bias']": False, "['dense']['kernel']": True,
                      "['embeddings']['embedding']": True, "['norm']['scale']": False}
    reference = optimi_run(params, grads, rates, decays, opt)
    for path, x in jax.tree_util.tree_flatten_with_path(ours)[0]:
        np.testing.assert_allclose(np.asarray(x), reference[jax.tree_util.keystr(path)], atol=1e-6, rtol=0)


def test_stacked_layers_clip_each_layer_alone():
    """With scan_layers a tensor holds every layer's weights: each layer's slice is clipped on its own RMS."""
    grad, nu = jnp.stack([jnp.full((3,), 10.0), jnp.full((3,), 0.1)]), jnp.ones((2, 3))
    np.testing.assert_allclose(optimizer.update_rms(grad, nu, 1e-6, True).ravel(), [10.0, 0.1], rtol=1e-6)
    np.testing.assert_allclose(optimizer.update_rms(grad, nu, 1e-6, False).ravel(), [math.sqrt(50.005)], rtol=1e-6)


def decay_formula(shape: str, x: float, power: float = 2.0) -> float:
    return {"linear": 1 - x, "polynomial": (1 - x) ** power, "cosine": (1 + math.cos(math.pi * x)) / 2,
            "1-sqrt": 1 - math.sqrt(x)}[shape]


def formula(step: int, peak: float, warmup: int, decay_begin: int, end: int, shape: str) -> float:
    """The schedule on paper, in float64."""
    if step < warmup:
        return peak * step / warmup
    if step < decay_begin:
        return peak
    return peak * decay_formula(shape, min(step - decay_begin, end - decay_begin) / (end - decay_begin))


@pytest.mark.parametrize("shape", optimizer.DECAYS)
@pytest.mark.parametrize("schedule,settings,decay_begin", [
    ("warmup_decay", {}, 10),
    ("wsd", {"decay_fraction": 0.25}, 75),
    ("wsd", {"decay_fraction": 0.25, "decay_start_step": 40}, 40),  # decay from a checkpoint, not the last quarter
])
def test_schedules_follow_their_formulas(shape, schedule, settings, decay_begin):
    opt = optimizer_config(schedule=schedule, decay=shape, learning_rate=1e-3, warmup_steps=10, **settings)
    optimizer.validate(opt, 100, 8)
    lr = optimizer.learning_rate_schedule(opt, 100)
    steps = np.arange(101)
    got = np.asarray(jax.jit(jax.vmap(lr))(steps), np.float64)
    want = [formula(s, 1e-3, 10, decay_begin, 100, shape) for s in steps]
    np.testing.assert_allclose(got, want, atol=1e-7, rtol=2e-7)  # float32: a few ulp of each value


def test_warmup_decay_keeps_the_old_linear_and_polynomial_values_bit_for_bit():
    for shape, power in (("linear", 1.0), ("polynomial", 2.0)):
        opt = optimizer_config(schedule="warmup_decay", decay=shape, learning_rate=1e-4, warmup_steps=30)
        old = optax.join_schedules([optax.linear_schedule(0.0, 1e-4, 30),
                                    optax.polynomial_schedule(1e-4, 0.0, power, 170)], [30])
        steps = jnp.arange(201)
        np.testing.assert_array_equal(jax.vmap(optimizer.learning_rate_schedule(opt, 200))(steps),
                                      jax.vmap(old)(steps))


def test_following_tokens_keeps_the_corners_at_their_steps():
    """With a clock (tokens seen in full-batch steps) the rate moves with the tokens between the configured steps."""
    opt = optimizer_config(schedule="wsd", decay="linear", learning_rate=1.0, warmup_steps=4, decay_fraction=0.5)
    clock = lambda step: jnp.interp(step, jnp.array([0.0, 4.0, 20.0]), jnp.array([0.0, 1.0, 17.0]))  # quarter batches
    lr = optimizer.learning_rate_schedule(opt, 20, clock)
    np.testing.assert_allclose([lr(s) for s in (0, 2, 4, 10, 20)], [0, 0.5, 1.0, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(lr(15), 1 - (12.0 - 7.0) / 10.0, atol=1e-6)  # tokens 12 of the decay's 7..17


def test_weight_decay_mask_is_an_explicit_regex():
    params = {"dense": {"kernel": 1, "bias": 1}, "norm": {"scale": 1}, "embeddings": {"embedding": 1}}
    assert optimizer.weight_decay_mask(params) == {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False},
                                                   "embeddings": {"embedding": True}}
    assert optimizer.weight_decay_mask(params, "bias$|scale$|embeddings/") == {
        "dense": {"kernel": True, "bias": False}, "norm": {"scale": False}, "embeddings": {"embedding": False}}


def test_a_carried_state_restarts_only_the_schedule():
    opt = optimizer_config(learning_rate=1e-3, warmup_steps=2)
    params = {"w": jnp.ones(3)}
    tx = optimizer.make_optimizer(opt, 10)
    state = tx.init(params)
    for _ in range(3):
        _, state = tx.update({"w": jnp.ones(3)}, state, params)
    restarted = optimizer.restart_schedule(state)
    moments, schedule = restarted[1]  # after global-norm clipping's empty state
    assert (int(moments.count), int(schedule.count)) == (3, 0)  # moments keep their count; the schedule restarts
    np.testing.assert_array_equal(moments.mu["w"], state[1][0].mu["w"])


@pytest.mark.parametrize("key,value,message", [
    ("schedule", "cosine", "config.optimizer.schedule='cosine': must be one of .* shape .* is config.optimizer.decay"),
    ("decay", "exp", "config.optimizer.decay='exp': must be one of"),
    ("decay_fraction", 1.5, "config.optimizer.decay_fraction=1.5: must be in"),
    ("decay_start_step", 5, "config.optimizer.decay_start_step=5: the decay would start at step 5, before"),
    ("no_weight_decay", "(bias", "config.optimizer.no_weight_decay='(bias': is not a regular expression"),
])
def test_bad_values_name_the_key(key, value, message):
    opt = optimizer_config(warmup_steps=10, **{"schedule": "wsd", key: value})
    with pytest.raises(optimizer.OptimizerConfigError, match=message.replace("(", r"\(")):
        optimizer.validate(opt, 100, 8)
