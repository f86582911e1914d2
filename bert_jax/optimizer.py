"""The optax optimizer `config.optimizer` describes: AdamW or LAMB, warmup then decay, global-norm clipping.

Weight decay skips biases and LayerNorm parameters (named `bias` and `scale`), as in BERT. Gradient accumulation is
not here: the train step averages gradients over micro-batches itself, so one step is always one update.
"""
from __future__ import annotations

import jax
import ml_collections
import optax

from bert_jax.errors import UserError

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "polynomial")
NO_DECAY_NAMES = ("bias", "scale")


class OptimizerConfigError(UserError, ValueError):
    """A config.optimizer value that cannot work; the message names the key."""


def validate(opt: ml_collections.ConfigDict, total_steps: int, batch_size: int) -> None:
    def require(ok, key, why):
        if not ok:
            raise OptimizerConfigError(f"config.optimizer.{key}={opt[key]!r}: {why}")

    require(opt.name in OPTIMIZERS, "name", f"must be one of {OPTIMIZERS}")
    require(opt.decay in DECAYS, "decay", f"must be one of {DECAYS}")
    require(opt.learning_rate > 0, "learning_rate", "must be positive")
    require(0 <= opt.warmup_steps <= total_steps, "warmup_steps",
            f"must be in [0, total_steps={total_steps}]")
    require(opt.grad_clip_norm >= 0, "grad_clip_norm", "must be >= 0 (0 turns clipping off)")
    require(opt.grad_accum_steps >= 1 and batch_size % opt.grad_accum_steps == 0, "grad_accum_steps",
            f"must be >= 1 and divide config.data.batch_size={batch_size}")


def learning_rate_schedule(opt: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to learning_rate, then linear or polynomial decay to 0 at total_steps."""
    power = 1.0 if opt.decay == "linear" else opt.power
    decay = optax.polynomial_schedule(opt.learning_rate, 0.0, power, max(total_steps - opt.warmup_steps, 1))
    warmup = optax.linear_schedule(0.0, opt.learning_rate, opt.warmup_steps)
    return optax.join_schedules([warmup, decay], [opt.warmup_steps])


def weight_decay_mask(params):
    """True for the parameters that decay; works on plain and on logically boxed parameter trees."""
    def decays(path, _):
        return getattr(path[-1], "key", None) not in NO_DECAY_NAMES

    return jax.tree_util.tree_map_with_path(decays, params, is_leaf=lambda x: hasattr(x, "unbox"))


def make_optimizer(opt: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(opt, total_steps)
    update = {"adamw": optax.adamw, "lamb": optax.lamb}[opt.name](
        schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=weight_decay_mask)
    if opt.grad_clip_norm:
        return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), update)
    return update
