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

import jax
import numpy as np
import tqdm
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import checkpoints, cli
from bert_jax.errors import UserError
from bert_jax.metrics_writer import MetricsWriter

NAN_POLICIES = ("stop", "skip")


class NonFiniteLossError(UserError, RuntimeError):
    """The loss became NaN or Inf under nan_policy='stop'; the update was not applied and nothing was saved."""


def announce(message: str, *args) -> None:
    """A line for the person watching process 0 (above the progress bar), also in the log."""
    logging.info(message, *args)
    if jax.process_index() == 0:
        tqdm.tqdm.write(message % args)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the loop logs, evaluates, saves and what it does with a non-finite loss (config keys of the same name)."""

    total_steps: int
    log_every_steps: int
    checkpoint_every_steps: int
    checkpoint_every_secs: float
    nan_policy: str
    eval_every_steps: int = 0  # 0: evaluate only after the last step


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


def summarize(pending: list[dict], first_step: int, nan_policy: str) -> tuple[dict, int]:
    """Mean metrics of the steps since the last log, and how many updates were skipped as non-finite.

    Under nan_policy='stop' a non-finite step raises, naming it; the state still holds the last good parameters.
    """
    fetched = jax.device_get(pending)
    finite = np.array([m.pop("finite") for m in fetched])
    if not finite.all() and nan_policy == "stop":
        bad = first_step + int(np.argmin(finite)) + 1
        raise NonFiniteLossError(f"the loss or gradient is NaN/Inf at step {bad}; stopping without applying or "
                                 "saving it, the last checkpoint is intact. Lower the learning rate, or set "
                                 "config.nan_policy=skip to skip such updates")
    good = [m for m, ok in zip(fetched, finite) if ok] or fetched
    means = {k: float(np.mean([m[k] for m in good])) for k in good[0]}
    return means, int((~finite).sum())


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
    that ends after the write failed.
    """
    writer = MetricsWriter(workdir, start_step)
    save_points = SavePoints(schedule.checkpoint_every_steps, schedule.checkpoint_every_secs, schedule.total_steps,
                             schedule.log_every_steps)
    progress = tqdm.tqdm(total=schedule.total_steps, initial=start_step, disable=jax.process_index() != 0,
                         unit="step", dynamic_ncols=True)
    pending, skipped, last_log, last_time = [], 0, start_step, time.perf_counter()
    stopped, evaluation = False, {}
    try:
        for step, batch in zip(range(start_step, schedule.total_steps), batches):
            state, metrics = step_fn(state, batch)
            pending.append(metrics)
            done = step + 1
            progress.update(1)
            save_now, stopped = save_points.at(done)
            eval_now = evaluate is not None and (done == schedule.total_steps or bool(schedule.eval_every_steps)
                                                 and done % schedule.eval_every_steps == 0)
            if done % schedule.log_every_steps == 0 or save_now or eval_now:
                summary, newly_skipped = summarize(pending, last_log, schedule.nan_policy)
                skipped += newly_skipped
                summary.update(throughput.metrics((done - last_log) / (time.perf_counter() - last_time),
                                                  summary.get("batch_size")), skipped_updates=skipped)
                if eval_now:
                    evaluation = evaluate(state)
                    summary.update(evaluation)
                log(writer, progress, done, summary)
                pending, last_log, last_time = [], done, time.perf_counter()
            if save_now:  # always when stopped
                save_started = time.perf_counter()
                checkpoints.save(manager, done, state)
                save_points.saved()
                if stopped:
                    checkpoints.wait_for_save(manager)
                    announce("stopped by signal at step %d; checkpoint saved in %.1f s, rerun the same command to "
                             "continue", done, time.perf_counter() - save_started)
                    break
            else:
                checkpoints.check_saves(manager)
        if start_step >= schedule.total_steps and evaluate is not None:  # resumed after the last save
            evaluation = evaluate(state)
            log(writer, progress, start_step, evaluation)
    except BaseException:
        with contextlib.suppress(checkpoints.SaveError):  # the error on its way out says more
            checkpoints.finish_saves(manager)
        raise
    else:
        checkpoints.finish_saves(manager)
    finally:
        save_points.close()
        progress.close()
        writer.close()
    if stopped and cli.in_command():
        cli.end_process(0)  # before this frame's caller frees the data pipeline: see the module's docstring
    return Outcome(state, stopped, {} if stopped else evaluation)


def log(writer: MetricsWriter, progress: tqdm.tqdm, step: int, summary: dict[str, float]) -> None:
    writer.write(step, summary)
    if "loss" in summary:
        postfix = {"loss": f"{summary['loss']:.4f}"}
        if "tokens_per_second" in summary:
            postfix["tok_s"] = f"{summary['tokens_per_second']:.0f}"
        if "packing_efficiency" in summary:
            postfix["packed"] = f"{summary['packing_efficiency']:.3f}"
        progress.set_postfix(postfix)
    announce("step %d: %s", step, ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
