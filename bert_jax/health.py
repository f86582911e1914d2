"""Whether a run's steps were healthy, and so which of its checkpoints a relaunch may resume from.

A step is unhealthy when its loss or gradient norm is NaN/Inf (the step then left the parameters as they were, see
bert_jax.train.train_step), or when either spikes: above the mean + `spike_sigmas` standard deviations of the last
`spike_window` healthy steps (tested once SPIKE_MIN_STEPS are in; spike_sigmas=0 turns the test off).

The parameters saved at step N are first judged by step N + 1: an update with a normal loss and gradient can still
diverge (a learning rate far too high) and only the next loss shows it. So a checkpoint becomes good once the step
after it was healthy. When a run stops on an unhealthy step, the checkpoints not shown good are moved aside whole
(checkpoints/N.diverged, which Orbax does not list) and a relaunch resumes from the newest good one. Retention never
deletes the newest good checkpoint, nor, once an update was skipped, the newest good one from before that skip.

nan_policy=stop stops at the first unhealthy step. nan_policy=skip lets the step drop a non-finite update and logs
it; more than `max_consecutive_skips` in a row stop the run as above. A spike stops the run under either policy:
the step that shows it has applied its update already.

What is known survives a restart in checkpoints/health.json (process 0 writes it at every save): the steps shown
good and the spike window, so that a resumed run judges its first steps as the uninterrupted one would.
"""
from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from bert_jax.errors import UserError

SPIKE_MIN_STEPS = 16  # fewer healthy steps than this give no spike test: their spread says too little
WATCHED = (("loss", "loss"), ("grad_norm", "gradient norm"))  # metric key, its name in messages
NAN_POLICIES = ("stop", "skip")


class DivergenceError(UserError, RuntimeError):
    """A step was unhealthy (or too many in a row were skipped); the message names the last good checkpoint."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """config.nan_policy, max_consecutive_skips, spike_window and spike_sigmas."""

    nan_policy: str = "stop"
    max_consecutive_skips: int = 10
    spike_window: int = 128
    spike_sigmas: float = 6.0


@dataclasses.dataclass
class Diverged(Exception):
    """The run must stop: `problem` at `step` (raised inside the loop, which moves bad checkpoints aside)."""

    step: int
    problem: str


def problem_of(metrics: dict, window: dict[str, collections.deque], sigmas: float) -> tuple[str, bool]:
    """(what is wrong with one step's metrics in words, "" when healthy; whether it is a non-finite value, which the
    step did not apply)."""
    for key, name in WATCHED:
        if key in metrics and not math.isfinite(metrics[key]):
            return f"the {name} is {metrics[key]}", True
    for key, name in WATCHED:
        history = window[key]
        if key in metrics and sigmas and len(history) >= SPIKE_MIN_STEPS:
            limit = float(np.mean(history) + sigmas * np.std(history))
            if metrics[key] > limit:
                return (f"the {name} spiked to {metrics[key]:.4g}, above {limit:.4g} (the mean + {sigmas:g} sigma "
                        f"of the last {len(history)} healthy steps)"), False
    return "", False


class Health:
    """The run loop's judge: `review` each logged stretch of steps, `saved` each checkpoint; `good` and `protected`
    say which checkpoints are shown good and which retention must keep."""

    def __init__(self, policy: Policy, record: dict, start_step: int, steps_on_disk: list[int]):
        self.policy = policy
        self.window = {key: collections.deque(record.get("window", {}).get(key, []), maxlen=policy.spike_window)
                       for key, _ in WATCHED}
        # A workdir from before this record: the checkpoints older than the resumed one count as good.
        known = record.get("good", [s for s in steps_on_disk if s < start_step])
        self.good = {s for s in known if s in steps_on_disk}
        self.pending = start_step if start_step and start_step not in self.good else None
        self.pinned = record.get("pinned")  # the newest good checkpoint from before the first skipped update
        self.skips_in_a_row = 0

    def review(self, first_step: int, fetched: list[dict]) -> tuple[list[str], Diverged | None]:
        """Judge steps first_step + 1, ...: (the problem of each, "" when healthy; why the run must stop, if it
        must)."""
        problems, stop = [], None
        for step, metrics in enumerate(fetched, first_step + 1):
            metrics = {k: float(v) for k, v in metrics.items() if np.ndim(v) == 0}
            problem, non_finite = problem_of(metrics, self.window, self.policy.spike_sigmas)
            problems.append(problem)
            if stop is not None:
                continue
            if not problem:
                self.skips_in_a_row = 0
                for key, _ in WATCHED:
                    if key in metrics:
                        self.window[key].append(metrics[key])
                if self.pending == step - 1:
                    self.good.add(self.pending)
                    self.pending = None
            elif self.policy.nan_policy != "skip" or not non_finite:
                stop = Diverged(step, problem)
            else:
                if self.pinned is None:
                    self.pinned = self.newest_good()
                self.skips_in_a_row += 1
                if self.skips_in_a_row > self.policy.max_consecutive_skips:
                    stop = Diverged(step, f"{problem}, the {self.skips_in_a_row}th skipped update in a row "
                                          f"(config.max_consecutive_skips={self.policy.max_consecutive_skips})")
        return problems, stop

    def saved(self, step: int) -> None:
        self.pending = step

    def newest_good(self) -> int | None:
        return max(self.good, default=None)

    def protected(self, last_save: bool = False) -> set[int]:
        """Steps retention keeps whatever keep_checkpoints says; at the run's last save not the newest good one,
        as no step will judge the last checkpoint."""
        return {s for s in (None if last_save else self.newest_good(), self.pinned) if s is not None}

    def record(self, steps_on_disk: list[int]) -> dict:
        """What checkpoints/health.json keeps of this judge."""
        return {"good": sorted(self.good & set(steps_on_disk)), "pinned": self.pinned,
                "window": {key: list(values) for key, values in self.window.items()}}


def stop_line(diverged: Diverged, good: int | None, moved: list[str]) -> str:
    """The one line of a divergence stop: what happened, what was moved aside, where a relaunch resumes."""
    aside = f" ({', '.join(moved)} moved aside, their files kept)" if moved else ""
    kept = f"the last good checkpoint is step {good}{aside}" if good is not None else (
        f"no good checkpoint exists{aside}")
    resume = f"resume from step {good}" if good is not None else "start from step 0"
    return (f"step {diverged.step}: {diverged.problem}; stopped, {kept}. Lower config.optimizer.learning_rate (or "
            "set config.nan_policy=skip to drop non-finite updates, or raise config.spike_sigmas for an expected "
            f"spike), then rerun the same command to {resume}")
