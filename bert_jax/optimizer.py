"""The optax optimizer `config.optimizer` describes: AdamW, LAMB or StableAdamW, a learning-rate schedule,
weight decay under an explicit mask, global-norm clipping.

Schedules (`schedule`, with the shape of the decay in `decay`):
- `warmup_decay` (BERT's): linear warmup to learning_rate over warmup_steps, then `decay` to 0 at total_steps;
- `wsd` (warmup-stable-decay: MiniCPM, Hägele et al. 2024, ModernBERT): warmup, a constant rate, then `decay` to 0
  over the last decay_fraction of the steps, or from decay_start_step on (to decay from any checkpoint of a run).
Decay shapes over the decay's progress x in [0, 1]: linear 1 - x, polynomial (1 - x)^power, cosine
(1 + cos(pi x)) / 2, 1-sqrt 1 - sqrt(x).

StableAdamW (Wortsman et al. 2023, as torch-optimi implements it for ModernBERT) is AdamW whose step on each tensor
is divided by max(1, RMS(g^2 / v)): Adafactor's update clipping, so a tensor whose gradient outgrows its second
moment takes a smaller step instead of a spike. Weight decay skips the parameters `no_weight_decay` matches
(biases and LayerNorm scales by default, as BERT and ModernBERT do); with fully_decoupled_weight_decay each step
decays by weight_decay x (schedule / peak) instead of weight_decay x learning rate (optimi's decouple_lr).
Gradient accumulation is not here: the train step averages gradients over micro-batches itself, so one step is
always one update.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax.errors import UserError

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("warmup_decay", "wsd")
DECAYS = ("linear", "polynomial", "cosine", "1-sqrt")
# Biases and LayerNorm scales, as BERT's optimizer and ModernBERT's (filter_bias_norm_wd) leave them undecayed.
DEFAULT_NO_WEIGHT_DECAY = r"(^|/)(bias|scale)$"
# The stacked axis of scanned layers (transformer.stacks_layers): each of its slices is a tensor of its own.
STACKED_LAYERS = "layers"


class OptimizerConfigError(UserError, ValueError):
    """A config.optimizer value that cannot work; the message names the key."""


def validate(opt: ml_collections.ConfigDict, total_steps: int, batch_size: int) -> None:
    def require(ok, key, why):
        if not ok:
            raise OptimizerConfigError(f"config.optimizer.{key}={opt[key]!r}: {why}")

    require(opt.name in OPTIMIZERS, "name", f"must be one of {OPTIMIZERS}")
    require(opt.schedule in SCHEDULES, "schedule", f"must be one of {SCHEDULES}; the decay's shape {DECAYS} is "
            "config.optimizer.decay")
    require(opt.decay in DECAYS, "decay", f"must be one of {DECAYS}")
    require(opt.learning_rate > 0, "learning_rate", "must be positive")
    require(0 <= opt.warmup_steps <= total_steps, "warmup_steps",
            f"must be in [0, total_steps={total_steps}]")
    if opt.schedule == "wsd":
        require(0.0 <= opt.decay_fraction <= 1.0, "decay_fraction", "must be in [0, 1] (0: no decay)")
        require(0 <= opt.decay_start_step <= total_steps, "decay_start_step",
                f"must be in [0, total_steps={total_steps}] (0: the last decay_fraction of the steps)")
        require(decay_start(opt, total_steps) >= opt.warmup_steps, "decay_start_step" if opt.decay_start_step
                else "decay_fraction", f"the decay would start at step {decay_start(opt, total_steps)}, before "
                f"warmup_steps={opt.warmup_steps} end; shorten the warmup or the decay")
    require(opt.weight_decay >= 0, "weight_decay", "must be >= 0")
    try:
        re.compile(opt.no_weight_decay)
    except re.error as e:
        require(False, "no_weight_decay", f"is not a regular expression ({e})")
    require(opt.grad_clip_norm >= 0, "grad_clip_norm", "must be >= 0 (0 turns clipping off)")
    require(opt.grad_accum_steps >= 1 and batch_size % opt.grad_accum_steps == 0, "grad_accum_steps",
            f"must be >= 1 and divide config.data.batch_size={batch_size}")


# ------------------------------------------------------------------------------------------------------ schedules


def decay_start(opt: ml_collections.ConfigDict, total_steps: int) -> int:
    """The step at which the decay begins: right after warmup for warmup_decay; for wsd decay_start_step, or the
    start of the last decay_fraction of the run."""
    if opt.schedule == "warmup_decay":
        return opt.warmup_steps
    return opt.decay_start_step or total_steps - round(opt.decay_fraction * total_steps)


def decay_schedule(opt: ml_collections.ConfigDict, steps) -> optax.Schedule:
    """learning_rate -> 0 over `steps` steps in the shape `opt.decay` (count 0 = the first step of the decay)."""
    if opt.decay == "cosine":
        return optax.cosine_decay_schedule(opt.learning_rate, steps)
    if opt.decay == "1-sqrt":
        return lambda count: opt.learning_rate * (1 - jnp.sqrt(jnp.clip(count, 0, steps) / steps))
    return optax.polynomial_schedule(opt.learning_rate, 0.0, 1.0 if opt.decay == "linear" else opt.power, steps)


def learning_rate_schedule(opt: ml_collections.ConfigDict, total_steps: int,
                           clock: Callable | None = None) -> optax.Schedule:
    """The learning rate of each step (count = updates so far): linear warmup from 0, a constant rate until the
    decay starts (wsd), then the decay to 0 at total_steps.

    `clock(step)` (batch-size warmup): the tokens seen before a step, in steps of the full batch. The schedule then
    follows the tokens: its corners stay at the configured steps, and between them the rate moves with the tokens.
    """
    corners = (opt.warmup_steps, decay_start(opt, total_steps), total_steps)
    warmup_end, decay_begin, end = (float(clock(s)) for s in corners) if clock else corners
    warmup = optax.linear_schedule(0.0, opt.learning_rate, warmup_end)
    decay = decay_schedule(opt, max(end - decay_begin, 1))
    if opt.schedule == "warmup_decay":
        schedule = optax.join_schedules([warmup, decay], [warmup_end])
    else:
        schedule = optax.join_schedules([warmup, optax.constant_schedule(opt.learning_rate), decay],
                                        [warmup_end, decay_begin])
    return (lambda count: schedule(clock(count))) if clock else schedule


# ------------------------------------------------------------------------------------------------- weight decay


def weight_decay_mask(params, no_weight_decay: str = DEFAULT_NO_WEIGHT_DECAY):
    """True for the parameters that decay: those whose '/'-joined path the regex `no_weight_decay` does not match.
    Works on plain and on logically boxed parameter trees."""
    pattern = re.compile(no_weight_decay)

    def decays(path, _):
        return not pattern.search("/".join(str(getattr(key, "key", key)) for key in path))

    return jax.tree_util.tree_map_with_path(decays, params, is_leaf=lambda x: hasattr(x, "unbox"))


def decay_coefficient(opt: ml_collections.ConfigDict) -> float:
    """What multiplies the learning rate in each step's decay: weight_decay, or weight_decay / peak rate when the
    decay follows only the schedule's shape (fully decoupled from the rate's size)."""
    return opt.weight_decay / opt.learning_rate if opt.fully_decoupled_weight_decay else opt.weight_decay


# ---------------------------------------------------------------------------------------------------- StableAdamW


class ScaleByStableAdamState(NamedTuple):
    count: jax.Array  # updates so far
    mu: optax.Updates  # debiased first moment (optimi's form: no bias correction needed)
    nu: optax.Updates  # debiased second moment


def debiased_beta(beta: float, step) -> jax.Array:
    """beta_hat with which an exponential average is its own bias-corrected value: beta (1 - beta^(t-1)) /
    (1 - beta^t), 0 at the first step."""
    power = jnp.asarray(beta, jnp.float32) ** step.astype(jnp.float32)
    return (power - beta) / (power - 1)


def update_rms(grad, nu, eps: float, stacked: bool):
    """sqrt(mean(g^2 / max(v, eps^2))) over each tensor (each layer's slice of a stacked one)."""
    axes = tuple(range(1 if stacked else 0, grad.ndim))
    ratio = jnp.mean(jnp.square(grad) / jnp.maximum(nu, eps * eps), axis=axes, keepdims=True)
    return jnp.sqrt(ratio)


def is_stacked(path) -> bool:
    return any(getattr(key, "key", None) == STACKED_LAYERS for key in path)


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float,
                         mask: Callable) -> optax.GradientTransformation:
    """StableAdamW's update before the learning rate: per tensor, (m / (sqrt(v) + eps) + weight_decay x param
    where `mask` says so) / max(1, RMS(g^2 / max(v, eps^2))), with the moments updated first."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ScaleByStableAdamState(jnp.zeros([], jnp.int32), zeros, jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params):
        count = state.count + 1
        b1_hat, b2_hat = debiased_beta(b1, count), debiased_beta(b2, count)
        mu = jax.tree.map(lambda m, g: m + (1 - b1_hat) * (g - m), state.mu, grads)
        nu = jax.tree.map(lambda v, g: v * b2_hat + (1 - b2_hat) * jnp.square(g), state.nu, grads)
        decays = mask(params)

        def step(path, g, m, v, p, decay):
            direction = m / (jnp.sqrt(v) + eps) + (weight_decay * p if decay else 0.0)
            return direction / jnp.maximum(1.0, update_rms(g, v, eps, is_stacked(path)))

        updates = jax.tree_util.tree_map_with_path(step, grads, mu, nu, params, decays)
        return updates, ScaleByStableAdamState(count, mu, nu)

    return optax.GradientTransformation(init, update)


def stable_adamw(learning_rate: optax.Schedule, b1: float, b2: float, eps: float, weight_decay: float,
                 mask: Callable) -> optax.GradientTransformation:
    """StableAdamW with the schedule in its own optax state (as optax.adamw keeps it)."""
    return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, mask),
                       optax.scale_by_learning_rate(learning_rate))


def make_optimizer(opt: ml_collections.ConfigDict, total_steps: int,
                   clock: Callable | None = None) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(opt, total_steps, clock)
    build = {"adamw": optax.adamw, "lamb": optax.lamb, "stable_adamw": stable_adamw}[opt.name]
    update = build(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=decay_coefficient(opt),
                   mask=lambda params: weight_decay_mask(params, opt.no_weight_decay))
    if opt.grad_clip_norm:
        return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), update)
    return update


def restart_schedule(opt_state):
    """An optimizer state carried into a new phase: moments and their step counts kept, the learning-rate
    schedule's own count back at 0 so the phase's schedule starts from its beginning."""
    restart = lambda x: x._replace(count=jnp.zeros_like(x.count)) if isinstance(x, optax.ScaleByScheduleState) else x
    return jax.tree.map(restart, opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
