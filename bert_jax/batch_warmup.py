"""Batch-size warmup by tokens (ModernBERT, after GPT-3): the global batch grows from config.batch_warmup.start
sequences to config.data.batch_size over the first config.batch_warmup.tokens tokens.

The growth is a staircase of at most config.batch_warmup.stages sizes, multiples of `start`: stage i of n covers
the tokens from i/(n-1) to (i+1)/(n-1) of the warmup with the size start + (full - start) i/(n-1) rounded down, and
the last stage is the full batch. Each size is one compiled step program, so a warmup costs at most n compiles.
A batch runs as the fewest micro-batches no larger than the configured ones (data.batch_size /
optimizer.grad_accum_steps), so memory never exceeds the full batch's.

Everything here is a pure function of the config, so the batch of a step, the examples before it and the tokens
seen are too: resuming at step N needs only N, across a size change as anywhere else.
"""
from __future__ import annotations

import dataclasses
import math

import ml_collections

from bert_jax.errors import UserError


class BatchWarmupError(UserError, ValueError):
    """A config.batch_warmup value that cannot work; the message names the key."""


@dataclasses.dataclass(frozen=True)
class Stage:
    first_step: int
    batch_size: int  # global sequences per step
    micro_batches: int  # how many micro-batches one step of this size runs as
    sequences_before: int  # global sequences of all steps before first_step


def validate(config: ml_collections.ConfigDict, process_count: int = 1) -> None:
    warmup, full = config.batch_warmup, config.data.batch_size

    def require(ok, key, why):
        if not ok:
            raise BatchWarmupError(f"config.batch_warmup.{key}={warmup[key]!r}: {why}")

    if not warmup.start:
        return
    require(0 < warmup.start < full and full % warmup.start == 0, "start",
            f"must divide config.data.batch_size={full} and be smaller (0 turns the warmup off)")
    require(warmup.start % process_count == 0, "start", f"must be a multiple of the process count {process_count}")
    require(warmup.tokens > 0, "tokens", "must be positive when batch_warmup.start is set")
    require(2 <= warmup.stages, "stages", "must be at least 2 (the start size and the full one)")


def micro_batches(batch_size: int, max_micro_batch: int) -> int:
    """The fewest micro-batches of equal size, at most max_micro_batch rows each, that a batch splits into."""
    return next(c for c in range(1, batch_size + 1) if batch_size % c == 0 and batch_size // c <= max_micro_batch)


def stages(config: ml_collections.ConfigDict) -> tuple[Stage, ...]:
    """The run's batch sizes by step. Without a warmup: one stage, the full batch in grad_accum_steps micro-batches."""
    full, warmup, seq_length = config.data.batch_size, config.batch_warmup, config.data.seq_length
    accum = config.optimizer.grad_accum_steps
    if not warmup.start:
        return (Stage(0, full, accum, 0),)
    last = warmup.stages - 1
    sizes = [warmup.start + (full - warmup.start) * i // last // warmup.start * warmup.start for i in range(last)]
    result, step, sequences = [], 0, 0
    for i, size in enumerate(sizes):
        if not result or result[-1].batch_size != size:  # a repeated size extends the stage before
            result.append(Stage(step, size, micro_batches(size, full // accum), sequences))
        steps = max(0, math.ceil((warmup.tokens * (i + 1) // last - sequences * seq_length) / (size * seq_length)))
        step, sequences = step + steps, sequences + steps * size
    result.append(Stage(step, full, micro_batches(full, full // accum), sequences))
    # A stage that got no step (its tokens already seen) is dropped.
    return tuple(s for s, after in zip(result, [*result[1:], None]) if after is None or after.first_step > s.first_step)


def stage_at(plan: tuple[Stage, ...], step: int) -> Stage:
    return [s for s in plan if s.first_step <= step][-1]


def sequences_before(plan: tuple[Stage, ...], step: int) -> int:
    """Global sequences of all steps before `step`: the stream position its batch starts at."""
    stage = stage_at(plan, step)
    return stage.sequences_before + stage.batch_size * (step - stage.first_step)

