"""The one training loop of pretraining and fine-tuning: steps, and on their schedule logging, evaluation,
checkpoints, the NaN policy and signals. bert_jax.train and bert_jax.finetune build the state, the jitted step and
the batches; this module runs them.

Every decision to save or stop is the same on every process at the same step (see SavePoints), so a multi-host run
never has one host waiting in a collective for another that left the loop.

A stop (a signal or a preemption notice) waits for its checkpoint to commit, says so with the time the save took,
and, in a command, ends the process right there (bert_jax.cli.end_process): what is left after that line only frees
memory, and on a loaded machine it took longer than the grace period a preemption gives (benchmarks/signal_exit.py).
A failed asynchronous save is looked for after every step, so the run stops at the first step that ends after the
write failed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

import jax
import numpy as np
import tqdm
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import checkpoints, cli, health, native_stderr, pod
from bert_jax.errors import UserError
from bert_jax.metrics_writer import MetricsWriteError, MetricsWriter
from bert_jax.watchdog import Watchdog

# What the schedules set for a step rather than what it measured: logged as the last step's value, not a mean.
SCHEDULED_METRICS = ("learning_rate", "batch_size", "masking_rate")


def announce(message: str, *args) -> None:
    """A line for the person watching process 0 (above the progress bar), also in the log."""
    logging.info(message, *args)
    if jax.process_index() == 0:
        tqdm.tqdm.write(message % args)


class LoopConfigError(UserError, ValueError):
    """A loop setting that cannot work; the message names the key."""


def validate(config) -> None:
    """Raise, naming the key, for loop settings every training command shares that cannot work."""
    if config.nan_policy not in health.NAN_POLICIES:
        raise LoopConfigError(f"config.nan_policy={config.nan_policy!r}: must be one of {health.NAN_POLICIES}")
    for key, least in (("max_consecutive_skips", 0), ("spike_window", 2), ("spike_sigmas", 0), ("watchdog_s", 0)):
        if config[key] < least:
            raise LoopConfigError(f"config.{key}={config[key]!r}: must be >= {least}")
    if config.distributed.peer_timeout_s < 1:
        raise LoopConfigError(f"config.distributed.peer_timeout_s={config.distributed.peer_timeout_s!r}: must be "
                              ">= 1 (seconds)")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the loop logs, evaluates, saves, and what it does with an unhealthy step (config keys of the same name;
    bert_jax.health)."""

    total_steps: int
    log_every_steps: int
    checkpoint_every_steps: int
    checkpoint_every_secs: float
    policy: health.Policy = health.Policy()
    eval_every_steps: int = 0  # 0: evaluate only after the last step
    watchdog_s: float = 0.0  # 0: no step watchdog

    @classmethod
    def of(cls, config, total_steps: int, eval_every_steps: int = 0) -> Schedule:
        """The schedule a run's config sets (pretraining, fine-tuning and embedding configs share these keys)."""
        policy = health.Policy(config.nan_policy, config.max_consecutive_skips, config.spike_window,
                               config.spike_sigmas)
        return cls(total_steps, config.log_every_steps, config.checkpoint_every_steps, config.checkpoint_every_secs,
                   policy, eval_every_steps, config.watchdog_s)


@dataclasses.dataclass(frozen=True)
class Throughput:
    """What a step of `batch_size` sequences costs, for tokens/s and MFU in the logged metrics (zeros leave those
    metrics out); steps of another size (a batch-size warmup) cost in proportion."""

    tokens_per_step: int = 0
    flops_per_step: float = 0.0
    peak_flops: float = 0.0
    batch_size: int = 0

    def metrics(self, steps_per_second: float, batch_size: float | None = None) -> dict[str, float]:
        scale = batch_size / self.batch_size if batch_size and self.batch_size else 1.0
        rates = {"steps_per_second": steps_per_second}
        if self.tokens_per_step:
            rates["tokens_per_second"] = steps_per_second * self.tokens_per_step * scale
        if self.flops_per_step and self.peak_flops:
            rates.update(model_flops_per_step=self.flops_per_step * scale,
                         mfu=steps_per_second * self.flops_per_step * scale / self.peak_flops)
        return rates


@dataclasses.dataclass
class Outcome:
    state: dict
    stopped: bool  # by a signal or a preemption notice, after saving; a rerun continues
    evaluation: dict[str, float]  # of the last step ({} when stopped or without an evaluate function)


def summarize(fetched: list[dict], problems: list[str]) -> dict:
    """The metrics of the steps since the last log: means over the healthy ones (all, if none was), the scheduled
    values of the last step."""
    fetched = [{k: v for k, v in m.items() if k != "finite"} for m in fetched]
    good = [m for m, problem in zip(fetched, problems) if not problem] or fetched
    return {k: float(fetched[-1][k] if k in SCHEDULED_METRICS else np.mean([m[k] for m in good])) for k in good[0]}


def preemption_notices() -> bool:
    """Whether JAX's multi-host preemption service runs (after jax.distributed.initialize): it then receives
    SIGTERM, TPU maintenance notices included, and names one step at which every host saves."""
    from jax._src import distributed  # the service's handle; multihost_utils offers no public test for it

    return distributed.global_state.preemption_sync_manager is not None


class SavePoints:
    """When the loop saves and when it stops, the same answer on every process at the same step.

    It saves every `every_steps` steps, when `every_secs` seconds of process 0's clock passed since the last save, at
    the last step, and then stops on SIGTERM/SIGINT or a preemption notice. Processes compare their signal flags
    and process 0's clock every `sync_every` steps; a preemption notice is agreed on by JAX's own sync point.
    """

    def __init__(self, every_steps: int, every_secs: float, last_step: int, sync_every: int):
        self.every_steps, self.every_secs, self.last_step, self.sync_every = (every_steps, every_secs, last_step,
                                                                              sync_every)
        self.signalled, self.last_save = False, time.monotonic()
        self.notices = preemption_notices()
        handled = (signal.SIGINT,) if self.notices else (signal.SIGTERM, signal.SIGINT)
        self._previous = {s: signal.signal(s, self._handle) for s in handled}

    def _handle(self, signum, frame):
        logging.warning("received signal %d: saving a checkpoint and stopping", signum)
        self.signalled = True

    def at(self, step: int) -> tuple[bool, bool]:
        """(save, stop) after `step` updates."""
        preempted = self.notices and multihost_utils.reached_preemption_sync_point(step)
        local = np.array([self.signalled, 0 < self.every_secs <= time.monotonic() - self.last_save])
        if jax.process_count() == 1:
            stop, time_due = local
        elif step % self.sync_every == 0:
            flags = multihost_utils.process_allgather(local)
            stop, time_due = flags[:, 0].any(), flags[0, 1]
        else:
            stop, time_due = False, False
        stop = bool(stop or preempted)
        return bool(stop or time_due or step % self.every_steps == 0 or step == self.last_step), stop

    def saved(self) -> None:
        self.last_save = time.monotonic()

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def run(state: dict, start_step: int, batches: Iterable[dict], step_fn: Callable, schedule: Schedule,
        workdir, manager, evaluate: Callable[[dict], dict[str, float]] | None = None,
        throughput: Throughput = Throughput()) -> Outcome:
    """Run step_fn from `start_step` to schedule.total_steps over `batches` (global batches from start_step on).

    Logged rows go to metrics.jsonl / TensorBoard, one row per step; `evaluate(state)` runs every
    schedule.eval_every_steps and after the last step, its metrics in the same row. A checkpoint is saved on the
    schedule, at the last step and on a signal: then the loop stops once that save has committed, and a command
    ends there (a caller in Python gets Outcome(stopped=True)). A failed save raises SaveError at the first step
    that ends after the write failed. An unhealthy step stops the run with DivergenceError after moving the
    checkpoints not shown good aside (bert_jax.health). In a command, a step that runs longer than
    schedule.watchdog_s ends the process (bert_jax.watchdog).
    """
    writer = MetricsWriter(workdir, start_step)
    save_points = SavePoints(schedule.checkpoint_every_steps, schedule.checkpoint_every_secs, schedule.total_steps,
                             schedule.log_every_steps)
    judge = health.Health(schedule.policy, checkpoints.read_health(manager), start_step, manager.all_steps())
    watchdog = Watchdog(schedule.watchdog_s if cli.in_command() else 0,
                        lambda step: pod.end_now(hung_line(step, schedule.watchdog_s, manager)))
    progress = tqdm.tqdm(total=schedule.total_steps, initial=start_step, disable=jax.process_index() != 0,
                         unit="step", dynamic_ncols=True)
    pending, skipped, last_log, last_time = [], 0, start_step, time.perf_counter()
    stopped, evaluation, shapes_run, batches = False, {}, set(), iter(batches)
    try:
        for step in range(start_step, schedule.total_steps):
            watchdog.arm(step + 1)
            batch = next(batches, None)
            if batch is None:
                break
            shape = jax.tree.map(np.shape, batch)
            if str(shape) not in shapes_run:  # the step compiles for this shape
                watchdog.disarm()
                shapes_run.add(str(shape))
            pod.note(step=step + 1)
            state, metrics = step_fn(state, batch)
            pending.append(metrics)
            done = step + 1
            progress.update(1)
            save_now, stopped = save_points.at(done)
            eval_now = evaluate is not None and (done == schedule.total_steps or bool(schedule.eval_every_steps)
                                                 and done % schedule.eval_every_steps == 0)
            if done % schedule.log_every_steps == 0 or save_now or eval_now:
                fetched = jax.device_get(pending)
                problems, diverged = judge.review(last_log, fetched)
                summary = summarize(fetched, problems)
                skipped_now = [{"step": s, "reason": p} for s, (m, p) in enumerate(zip(fetched, problems), last_log + 1)
                               if not m.get("finite", True)]  # the updates the step did not apply
                skipped += len(skipped_now)
                summary.update(throughput.metrics((done - last_log) / (time.perf_counter() - last_time),
                                                  summary.get("batch_size")), skipped_updates=skipped)
                if diverged:
                    log(writer, progress, done, summary, skipped_now)
                    stop_diverged(diverged, judge, manager)
                if eval_now:
                    watchdog.disarm()
                    evaluation = evaluate(state)
                    summary.update(evaluation)
                log(writer, progress, done, summary, skipped_steps=skipped_now)
                pending, last_log, last_time = [], done, time.perf_counter()
            if save_now:  # always when stopped
                watchdog.disarm()
                save_started = time.perf_counter()
                checkpoints.protect(manager, judge.protected(last_save=done == schedule.total_steps))
                checkpoints.save(manager, done, state)
                judge.saved(done)
                checkpoints.write_health(manager, judge.record(manager.all_steps()))
                save_points.saved()
                if stopped:
                    checkpoints.wait_for_save(manager)
                    announce("stopped by signal at step %d; checkpoint saved in %.1f s, rerun the same command to "
                             "continue", done, time.perf_counter() - save_started)
                    break
            else:
                checkpoints.check_saves(manager)
            pod.note(committed=checkpoints.committed_step(manager))
        watchdog.disarm()
        if start_step >= schedule.total_steps and evaluate is not None:  # resumed after the last save
            evaluation = evaluate(state)
            log(writer, progress, start_step, evaluation)
    except BaseException as error:
        # A command ends right after its error line, without waiting for a save in flight: in a bucket that is out
        # of reach the wait is tensorstore's whole retry budget (minutes), and a step that never committed is a
        # temporary folder the next run removes. A caller in Python gets the manager finished.
        if not cli.in_command():
            with contextlib.suppress(checkpoints.SaveError):  # the error on its way out says more
                checkpoints.finish_saves(manager)
        if isinstance(error, MetricsWriteError):
            committed = checkpoints.committed_step(manager)
            resume = f"resume from step {committed}" if committed else "start again (no checkpoint was saved)"
            raise MetricsWriteError(f"{error}, then rerun the same command to {resume}") from error
        raise
    else:
        checkpoints.finish_saves(manager)
    finally:
        watchdog.close()
        save_points.close()
        progress.close()
        writer.close()
    if stopped and cli.in_command():
        cli.end_process(0)  # before this frame's caller frees the data pipeline: see the module's docstring
    return Outcome(state, stopped, {} if stopped else evaluation)


def stop_diverged(diverged: health.Diverged, judge: health.Health, manager) -> NoReturn:
    """Move the checkpoints not shown good aside, so that a relaunch resumes from the newest good one, and raise
    DivergenceError naming it."""
    checkpoints.wait_for_save(manager)
    good = judge.newest_good()
    moved = checkpoints.move_aside(manager, [s for s in manager.all_steps() if good is None or s > good], "diverged")
    checkpoints.write_health(manager, judge.record(manager.all_steps()))
    raise health.DivergenceError(health.stop_line(diverged, good, moved))


def hung_line(step: int, seconds: float, manager) -> str:
    """The watchdog's line."""
    return (f"error: step {step} did not finish within config.watchdog_s={seconds:g} s (a stalled input, device "
            f"or process); {native_stderr.relaunch(checkpoints.committed_step(manager))}")


def log(writer: MetricsWriter, progress: tqdm.tqdm, step: int, summary: dict[str, float],
        skipped_steps: list[dict] = ()) -> None:
    """A row of metrics.jsonl / TensorBoard and the console; the skipped updates (step, reason) go to the JSON row."""
    writer.write(step, summary, {"skipped_steps": list(skipped_steps)} if skipped_steps else {})
    if "loss" in summary:
        postfix = {"loss": f"{summary['loss']:.4f}"}
        if "tokens_per_second" in summary:
            postfix["tok_s"] = f"{summary['tokens_per_second']:.0f}"
        if "packing_efficiency" in summary:
            postfix["packed"] = f"{summary['packing_efficiency']:.3f}"
        progress.set_postfix(postfix)
    announce("step %d: %s", step, ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
