"""Pretraining for the four families: one jitted step per objective, sharded over a (data, fsdp, tensor) mesh.

    python -m bert_jax.train --config=configs/bert.py:tiny --workdir=runs/bert-tiny [--config.key=value ...]

A workdir that holds a checkpoint continues from it up to config.total_steps, with the same result as a run that
was never stopped. On a TPU pod slice every host runs the same command with --distributed; on GPU hosts add
--coordinator_address=HOST:PORT --num_processes=N --process_id=I (or --distributed under SLURM / Open MPI).
"""
from __future__ import annotations

import functools
import itertools
import signal
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from absl import app, flags, logging
from flax import linen as nn
from jax.experimental import multihost_utils
from ml_collections import config_flags

from bert_jax import checkpoints, flops, objectives, sharding, storage
from bert_jax import optimizer as optimizer_lib
from bert_jax.metrics_writer import MetricsWriter
from bert_jax.modeling import count_params, dummy_inputs, pretraining_model
from bert_jax.modeling.transformer import attention_kernel, padded_vocab_size

NAN_POLICIES = ("stop", "skip")


class TrainConfigError(ValueError):
    """A trainer setting that cannot work; the message names the key."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or Inf under nan_policy='stop'; the update was not applied and nothing was saved."""


# ------------------------------------------------------------------------------------------------------------------
# Pieces of the loop: each is a pure function or a small object; `train_and_evaluate` puts them in order.
# ------------------------------------------------------------------------------------------------------------------


def announce(message: str, *args) -> None:
    """A line for the person watching process 0 (above the progress bar), also in the log."""
    logging.info(message, *args)
    if jax.process_index() == 0:
        tqdm.tqdm.write(message % args)


def enable_compilation_cache(directory: str) -> None:
    """Reuse compiled XLA programs across restarts and runs: a resumed or repeated job skips most of its compile."""
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def validate(config: ml_collections.ConfigDict, mesh) -> None:
    """Raise (naming the key) before any compute for settings the loop or the mesh cannot take."""
    for key in ("total_steps", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
        if config[key] < 1:
            raise TrainConfigError(f"config.{key}={config[key]!r}: must be >= 1")
    if config.checkpoint_every_secs < 0:
        raise TrainConfigError(f"config.checkpoint_every_secs={config.checkpoint_every_secs!r}: must be >= 0 "
                               "(0: no time-based saves)")
    if config.eval_every_steps < 0 or config.eval_steps < 1:
        raise TrainConfigError("config.eval_every_steps must be >= 0 (0: no evaluation) and config.eval_steps >= 1")
    if config.nan_policy not in NAN_POLICIES:
        raise TrainConfigError(f"config.nan_policy={config.nan_policy!r}: must be one of {NAN_POLICIES}")
    optimizer_lib.validate(config.optimizer, config.total_steps, config.data.batch_size)
    micro_batch = config.data.batch_size // config.optimizer.grad_accum_steps
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if micro_batch % shards:
        raise sharding.MeshError(
            f"config.data.batch_size={config.data.batch_size} (micro-batches of {micro_batch} with "
            f"grad_accum_steps={config.optimizer.grad_accum_steps}) does not split over mesh data*fsdp = {shards}; "
            "choose a batch size or mesh where it does")
    sharding.check_model_fits(config.model, mesh, config.data.seq_length, config.mesh.sequence_parallel,
                              padded_vocab_size(config.model))


def pretraining_batches(config, start_step: int, process_index: int, process_count: int):
    """This host's numpy batches from batch `start_step` on (the input pipeline's contract)."""
    from bert_jax.input_pipeline import PretrainingPipeline

    pipeline = PretrainingPipeline(config, process_index, process_count)
    if pipeline.tokenizer.vocab_size > config.model.vocab_size:
        raise TrainConfigError(f"config.model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
                               f"{pipeline.tokenizer.vocab_size} ids ({config.data.tokenizer_path}); raise it")
    return pipeline.dataset(start_step * pipeline.local_batch_size).as_numpy_iterator()


def global_batch(local_batch: dict, batch_sharding) -> dict:
    """Each host's rows of the batch -> one jax.Array per key, split over the mesh's batch axes."""
    return {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local_batch.items()}


def initial_state(model: nn.Module, tx: optax.GradientTransformation, rng) -> dict:
    """The whole trainer state, parameters still boxed with logical axis names (eval_shape it for shardings)."""
    params_rng, state_rng = jax.random.split(rng)
    params = model.init({"params": params_rng}, **dummy_inputs())["params"]
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(state_rng)}


def micro_batches(batch: dict, count: int) -> dict:
    """[B, ...] -> [count, B / count, ...], micro-batch i = rows i, i + count, ...: every device keeps its rows."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1), batch)


def gradients(loss_fn, params, batch, rng, accum_steps: int):
    """(metrics, grads) of the batch, averaged over `accum_steps` micro-batches run one after another."""
    grad_fn = jax.grad(loss_fn, has_aux=True)
    if accum_steps == 1:
        grads, metrics = grad_fn(params, batch, rng)
        return metrics, grads
    micro = micro_batches(batch, accum_steps)

    def accumulate(total, xs):
        index, mb = xs
        grads, metrics = grad_fn(params, mb, jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, total, (metrics, grads)), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grad_fn, params, first, rng)[::-1])
    total, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))
    return jax.tree.map(lambda x: x / accum_steps, total)


def train_step(state: dict, batch: dict, *, loss_fn, tx, schedule, accum_steps: int):
    """One update. A non-finite loss or gradient leaves params and optimizer state as they were (the host then stops
    or skips, per nan_policy); the step still advances so the data stays aligned with it.

    The update sits under lax.cond, decided before it runs, rather than a select between new and old state after
    it (which needs both whole states alive at once). Finite gradients give finite AdamW / LAMB updates, so
    checking them is enough."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    metrics, grads = gradients(loss_fn, state["params"], batch, rng, accum_steps)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)

    def update(params, opt_state):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params, opt_state = jax.lax.cond(finite, update, lambda *unchanged: unchanged, state["params"], state["opt_state"])
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1, "rng": state["rng"]}
    metrics = {**metrics, "grad_norm": grad_norm, "learning_rate": schedule(state["step"]), "finite": finite}
    return new_state, metrics


def eval_step(params, batch, *, loss_fn):
    """Metrics without dropout; a fixed rng keeps ELECTRA's generator samples the same at every evaluation."""
    return loss_fn(params, batch, jax.random.key(0), deterministic=True)[1]


def measured_peak_flops() -> float:
    """FLOP/s of one device on a large matmul (bfloat16 on accelerators): the MFU denominator if none is given."""
    cpu = jax.devices()[0].platform == "cpu"
    n, dtype = (1024, jnp.float32) if cpu else (8192, jnp.bfloat16)
    x = jax.device_put(jnp.ones((n, n), dtype), jax.local_devices()[0])
    matmul = jax.jit(lambda a: a @ a)
    matmul(x).block_until_ready()
    start, reps = time.perf_counter(), 3
    for _ in range(reps):
        matmul(x).block_until_ready()
    return 2 * n ** 3 * reps / (time.perf_counter() - start)


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


# ------------------------------------------------------------------------------------------------------------------
# The trainer, top to bottom.
# ------------------------------------------------------------------------------------------------------------------


class Program(NamedTuple):
    """What the loop runs, built from the config and the mesh alone (benchmarks/sharding.py compiles it too)."""

    model: nn.Module
    init_fn: Callable  # rng -> the whole state, boxed with logical names
    state_shardings: Any
    abstract_state: Any  # ShapeDtypeStructs with their shardings
    parameter_count: int
    step: Callable  # jitted (state, batch) -> (state, metrics); the state's buffers donated
    evaluate: Callable  # jitted (params, batch) -> metrics


def build_program(config: ml_collections.ConfigDict, mesh) -> Program:
    """Model, optimizer, state shardings from the logical rules, and the jitted train and eval steps."""
    model = pretraining_model(config)
    tx = optimizer_lib.make_optimizer(config.optimizer, config.total_steps)
    schedule = optimizer_lib.learning_rate_schedule(config.optimizer, config.total_steps)
    init_fn = functools.partial(initial_state, model, tx)
    boxed_state = jax.eval_shape(init_fn, jax.random.key(config.seed))
    state_shardings = sharding.mesh_shardings(boxed_state, mesh)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    loss_fn = objectives.loss_fn(config, model)
    step = jax.jit(
        sharding.laid_out(functools.partial(train_step, loss_fn=loss_fn, tx=tx, schedule=schedule,
                                            accum_steps=config.optimizer.grad_accum_steps),
                          mesh, config.mesh.sequence_parallel),
        in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, replicated),
        donate_argnums=0)
    evaluate = jax.jit(sharding.laid_out(functools.partial(eval_step, loss_fn=loss_fn), mesh,
                                         config.mesh.sequence_parallel),
                       in_shardings=(state_shardings["params"], batch_sharding), out_shardings=replicated)
    return Program(model, init_fn, state_shardings,
                   checkpoints.abstract_tree(nn.unbox(boxed_state), state_shardings),
                   count_params(boxed_state["params"], config.model), step, evaluate)


def abstract_batch(config: ml_collections.ConfigDict, mesh) -> dict:
    """The shapes of one global batch as the pipeline yields it, split over the mesh: enough to compile a step."""
    b, s, p = config.data.batch_size, config.data.seq_length, config.masking.max_predictions_per_seq
    shapes = dict(input_ids=(b, s), input_mask=(b, s), segment_ids=(b, s), masked_lm_positions=(b, p),
                  masked_lm_ids=(b, p), masked_lm_weights=(b, p), next_sentence_labels=(b,),
                  sentence_order_labels=(b,))
    batch_sharding = sharding.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding) for k, shape in shapes.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, batches_fn=pretraining_batches) -> dict:
    """Pretrain config.model on config.objective until config.total_steps; returns the final state.

    `batches_fn(config, start_step, process_index, process_count)` yields this host's numpy batches; tests pass
    synthetic ones.
    """
    process_index, process_count = jax.process_index(), jax.process_count()
    if config.compilation_cache_dir:
        enable_compilation_cache(config.compilation_cache_dir)
    announce("process %d of %d, %d local / %d global devices", process_index, process_count,
             jax.local_device_count(), jax.device_count())

    # ---- Mesh, and every check that needs no compute -----------------------------------------------------------
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    validate(config, mesh)
    workdir = checkpoints.prepare_workdir(workdir)
    checkpoints.check_same_model(workdir, config)
    checkpoints.write_config(workdir, config)
    batch_sharding = sharding.batch_sharding(mesh)
    announce("mesh %s", dict(mesh.shape))

    # ---- Model, optimizer, abstract state and its shardings from the logical rules ------------------------------
    program = build_program(config, mesh)
    state_shardings, init_fn = program.state_shardings, program.init_fn
    announce("%s: %.2fM parameters; %s attention while training, %s compute", type(program.model).__name__,
             program.parameter_count / 1e6, attention_kernel(config.model, deterministic=False), config.model.dtype)

    # ---- Restore the latest checkpoint, or initialise in place on the mesh -------------------------------------
    manager = checkpoints.checkpoint_manager(workdir, config.keep_checkpoints)
    start_step = manager.latest_step() or 0
    if start_step:
        announce("resuming from %s at step %d", manager.directory, start_step)
        state = checkpoints.restore(manager, start_step, program.abstract_state)
    else:
        init = jax.jit(lambda rng: nn.unbox(init_fn(rng)), out_shardings=state_shardings)
        state = init(jax.random.key(config.seed))
    if start_step >= config.total_steps:
        announce("step %d: config.total_steps=%d already reached", start_step, config.total_steps)
        manager.close()
        return state

    # ---- Data: batch i is a pure function of (seed, i), so resuming needs only the step ------------------------
    batches = batches_fn(config, start_step, process_index, process_count)
    eval_batches = []
    if config.eval_every_steps:
        eval_config = ml_collections.ConfigDict(config.to_dict())
        eval_config.seed = config.seed + 1  # another example order and other masks than training sees
        eval_batches = [global_batch(b, batch_sharding)
                        for b in itertools.islice(batches_fn(eval_config, 0, process_index, process_count),
                                                  config.eval_steps)]

    step_fn, evaluate = program.step, program.evaluate
    flops_per_step = flops.train_step_flops(config)
    peak_flops = (config.peak_flops or measured_peak_flops()) * jax.device_count()
    tokens_per_step = config.data.batch_size * config.data.seq_length
    announce("model FLOPs per step %.3g; peak %.3g FLOP/s over %d devices", flops_per_step, peak_flops,
             jax.device_count())

    # ---- Loop: step, then log / evaluate / checkpoint on their intervals; a signal saves and stops -------------
    writer = MetricsWriter(workdir, start_step)
    save_points = SavePoints(config.checkpoint_every_steps, config.checkpoint_every_secs, config.total_steps,
                             config.log_every_steps)
    progress = tqdm.tqdm(total=config.total_steps, initial=start_step, disable=process_index != 0,
                         unit="step", dynamic_ncols=True)
    pending, skipped, last_log, last_time = [], 0, start_step, time.perf_counter()
    try:
        for step, local_batch in zip(range(start_step, config.total_steps), batches):
            state, metrics = step_fn(state, global_batch(local_batch, batch_sharding))
            pending.append(metrics)
            done = step + 1
            progress.update(1)
            save_now, stop_now = save_points.at(done)
            eval_now = bool(config.eval_every_steps) and done % config.eval_every_steps == 0
            if done % config.log_every_steps == 0 or save_now or eval_now:
                summary, newly_skipped = summarize(pending, last_log, config.nan_policy)
                skipped += newly_skipped
                now = time.perf_counter()
                steps_per_second = (done - last_log) / (now - last_time)
                summary.update(steps_per_second=steps_per_second,
                               tokens_per_second=steps_per_second * tokens_per_step,
                               model_flops_per_step=flops_per_step,
                               mfu=steps_per_second * flops_per_step / peak_flops, skipped_updates=skipped)
                if eval_now:
                    results = jax.device_get([evaluate(state["params"], b) for b in eval_batches])
                    summary.update({f"eval_{k}": float(np.mean([r[k] for r in results])) for k in results[0]})
                writer.write(done, summary)
                progress.set_postfix(loss=f"{summary['loss']:.4f}", tok_s=f"{summary['tokens_per_second']:.0f}")
                announce("step %d: %s", done, ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
                pending, last_log, last_time = [], done, time.perf_counter()
            if save_now:
                checkpoints.save(manager, done, state)
                save_points.saved()
            if stop_now:
                announce("stopped by signal at step %d; checkpoint saved", done)
                break
    finally:
        manager.wait_until_finished()
        manager.close()
        save_points.close()
        progress.close()
        writer.close()
    return state


flags.DEFINE_string("workdir", None, "Where config.json, checkpoints/, metrics.jsonl and tensorboard/ go: a "
                    "local folder or a bucket URL (gs://...).", required=True)
config_flags.DEFINE_config_file("config", None, "configs/<family>.py:<size>", lock_config=True)
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the cluster detected from the "
                  "environment (TPU pod slices, SLURM, Open MPI).")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0, for a multi-process run without a "
                    "detectable cluster; needs --num_processes and --process_id.")
flags.DEFINE_integer("num_processes", None, "Processes in a --coordinator_address run.")
flags.DEFINE_integer("process_id", None, "This process's index in a --coordinator_address run.")


# Errors that name what is wrong and what to do: the command prints their one line, a traceback only with --verbosity.
USER_ERRORS = (storage.StorageError, checkpoints.WorkdirError, checkpoints.CheckpointMismatchError, TrainConfigError,
               sharding.MeshError, optimizer_lib.OptimizerConfigError)


def cli_main(train_fn, user_errors=USER_ERRORS):
    """The absl main of a training command (pretraining, fine-tuning): quiet logging, multi-host initialisation,
    then train_fn(--config, --workdir); `user_errors` end the command with their one-line message and exit code 1."""

    def main(argv):
        del argv
        verbose = flags.FLAGS["verbosity"].present
        if not verbose:
            logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO; --verbosity=0 shows it all
        if flags.FLAGS.coordinator_address or flags.FLAGS.distributed:
            jax.distributed.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                                       flags.FLAGS.process_id)
        try:
            train_fn(flags.FLAGS.config, flags.FLAGS.workdir)
        except user_errors as e:
            if verbose:
                raise
            raise SystemExit(f"error: {e}") from None

    return main


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(cli_main(train_and_evaluate))
