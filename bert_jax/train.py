"""Pretraining for every family: one jitted step per objective, sharded over a (data, fsdp, tensor) mesh.

    python -m bert_jax.train --config=configs/bert.py:tiny --workdir=runs/bert-tiny [--config.key=value ...]

A workdir that holds a checkpoint continues from it up to config.total_steps, with the same result as a run that
was never stopped. On a TPU pod slice every host runs the same command with --distributed; on GPU hosts add
--coordinator_address=HOST:PORT --num_processes=N --process_id=I (or --distributed under SLURM / Open MPI).
"""
from __future__ import annotations

import functools
import itertools
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import flags
from flax import linen as nn
from ml_collections import config_flags

from bert_jax import batch_warmup, checkpoints, cli, config_lib, flops, init_from, native_stderr, objectives, pod
from bert_jax import run_loop, sharding
from bert_jax import optimizer as optimizer_lib
from bert_jax import workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.input_pipeline.config import PAIR_KINDS, masking_rates
from bert_jax.modeling import count_params, dummy_inputs, pretraining_model
from bert_jax.modeling.transformer import attention_kernel, padded_vocab_size


class TrainConfigError(UserError, ValueError):
    """A trainer setting that cannot work; the message names the key."""


# ------------------------------------------------------------------------------------------------------------------
# Pieces of the loop: each is a pure function or a small object; `train_and_evaluate` puts them in order.
# ------------------------------------------------------------------------------------------------------------------


def enable_compilation_cache(directory: str) -> None:
    """Reuse compiled XLA programs across restarts and runs: a resumed or repeated job skips most of its compile."""
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def check_objective(config: ml_collections.ConfigDict) -> None:
    if config.objective not in objectives.OBJECTIVES:
        raise TrainConfigError(f"config.objective={config.objective!r}: must be one of {objectives.OBJECTIVES}")


def validate(config: ml_collections.ConfigDict, mesh) -> None:
    """Raise (naming the key) before any compute for settings the model, the loop or the mesh cannot take."""
    check_objective(config)
    config_lib.validate_model_config(config.model, needs_generator=config.objective == "rtd")
    for key in ("total_steps", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
        if config[key] < 1:
            raise TrainConfigError(f"config.{key}={config[key]!r}: must be >= 1")
    if config.checkpoint_every_secs < 0:
        raise TrainConfigError(f"config.checkpoint_every_secs={config.checkpoint_every_secs!r}: must be >= 0 "
                               "(0: no time-based saves)")
    if config.eval_every_steps < 0 or config.eval_steps < 1:
        raise TrainConfigError("config.eval_every_steps must be >= 0 (0: no evaluation) and config.eval_steps >= 1")
    run_loop.validate(config)
    optimizer_lib.validate(config.optimizer, config.total_steps, config.data.batch_size)
    batch_warmup.validate(config)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    for stage in batch_warmup.stages(config):
        micro_batch = stage.batch_size // stage.micro_batches
        if micro_batch % shards:
            key = "batch_warmup.start" if config.batch_warmup.start else "data.batch_size"
            raise sharding.MeshError(
                f"config.{key}: batches of {stage.batch_size} (micro-batches of {micro_batch} with "
                f"grad_accum_steps={config.optimizer.grad_accum_steps}) do not split over mesh data*fsdp = {shards}; "
                "choose a batch size or mesh where they do")
    sharding.check_model_fits(config.model, mesh, config.data.seq_length, config.mesh.sequence_parallel,
                              padded_vocab_size(config.model))


def pretraining_data(config: ml_collections.ConfigDict, process_index: int, process_count: int):
    """The input pipeline, built before the workdir is touched (files, tokenizer and corpus are checked here); returns
    the trainer's `batches_fn(config, start_step, process_index, process_count)`: this host's numpy batches from
    batch `start_step` on. Another seed (the evaluation stream) builds its own pipeline."""
    from bert_jax.input_pipeline import PretrainingPipeline

    pipeline = PretrainingPipeline(config, process_index, process_count)
    if pipeline.tokenizer.vocab_size > config.model.vocab_size:
        raise TrainConfigError(f"config.model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
                               f"{pipeline.tokenizer.vocab_size} ids ({config.data.tokenizer_path}); raise it")

    def batches(wanted, start_step: int, process_index: int, process_count: int):
        source = pipeline if wanted.seed == config.seed else PretrainingPipeline(wanted, process_index, process_count)
        return source.batches_from(start_step)

    return batches


def global_batch(local_batch: dict, batch_sharding) -> dict:
    """Each host's rows of the batch -> one jax.Array per key, split over the mesh's batch axes."""
    return {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local_batch.items()}


def initial_state(model: nn.Module, tx: optax.GradientTransformation, rng) -> dict:
    """The whole trainer state, parameters still boxed with logical axis names (eval_shape it for shardings)."""
    params_rng, state_rng = jax.random.split(rng)
    params = model.init({"params": params_rng}, **dummy_inputs())["params"]
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(state_rng)}


def resumed_or_fresh_state(manager, init_fn, mesh, seed: int) -> tuple[int, dict, dict]:
    """(start step, state, state shardings) of a fine-tuning or embedding run: the newest readable checkpoint in
    `manager`, or step 0 and init_fn's state initialised in place on the mesh (the caller then puts its pretrained
    weights in)."""
    boxed_state = jax.eval_shape(init_fn, jax.random.key(seed))
    state_shardings = sharding.mesh_shardings(boxed_state, mesh)
    abstract_state = checkpoints.abstract_tree(nn.unbox(boxed_state), state_shardings)
    start_step, state = checkpoints.restore_latest(manager, abstract_state)
    if start_step:
        run_loop.announce("resuming from %s at step %d", manager.directory, start_step)
        return start_step, state, state_shardings
    fresh = jax.jit(lambda rng: nn.unbox(init_fn(rng)), out_shardings=state_shardings)(jax.random.key(seed))
    return 0, fresh, state_shardings


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


def pretraining_batch_metrics(batch: dict, step, *, masking) -> dict:
    """packing_efficiency: real tokens over the slots of the batch (1.0: no padding at all); batch_size: its
    sequences (they grow under a batch-size warmup); masking_rate: the rate config.masking gives this step (its
    rate_schedule's)."""
    first_steps, rates = masking_rates(masking)
    rate = jnp.asarray(rates, jnp.float32)[jnp.searchsorted(jnp.asarray(first_steps), step, side="right") - 1]
    return {"packing_efficiency": jnp.mean(batch["input_mask"], dtype=jnp.float32),
            "batch_size": jnp.asarray(batch["input_mask"].shape[0], jnp.float32), "masking_rate": rate}


def token_clock(plan: tuple[batch_warmup.Stage, ...], full_batch: int) -> Callable:
    """step -> the sequences seen before it, in steps of the full batch (float, traceable): what the learning-rate
    schedule reads under a batch-size warmup, so that the rate follows the tokens seen."""
    firsts = jnp.array([s.first_step for s in plan], jnp.float32)
    starts = jnp.array([s.sequences_before / full_batch for s in plan], jnp.float32)
    slopes = jnp.array([s.batch_size / full_batch for s in plan], jnp.float32)

    def full_steps(step):
        step = jnp.asarray(step, jnp.float32)
        index = jnp.searchsorted(firsts, step, side="right") - 1
        return starts[index] + (step - firsts[index]) * slopes[index]

    return full_steps


def train_step(state: dict, batch: dict, *, loss_fn, tx, schedule, accum_steps, batch_metrics=None,
               param_shardings=None):
    """One update. A non-finite loss or gradient leaves params and optimizer state as they were (the host then stops
    or skips, per nan_policy); the step still advances so the data stays aligned with it.

    Each new leaf is a select between the updated and the old value, which XLA fuses into the update's own
    elementwise kernels (no second state is alive; the compiled memory is the same). Under lax.cond instead, XLA:GPU
    copied every leaf of the state out of the conditional each step (BERT-base: 621 copies of 1.2 GB; its kernel
    launches a step fell from 2,141 to 1,190; bert_jax.gpu_compile_check). Finite gradients give finite AdamW / LAMB
    updates, so checking them is enough.

    `accum_steps`: micro-batches per update, or {batch rows: micro-batches} under a batch-size warmup (the rows are
    static, so each size compiles its own step). `param_shardings`: the gradients are laid out as the parameters, so
    that FSDP reduce-scatters each one; without the conditional's boundary XLA:TPU all-reduced the position table's
    whole."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    rows = jax.tree.leaves(batch)[0].shape[0]
    accum = accum_steps if isinstance(accum_steps, int) else accum_steps[rows]
    metrics, grads = gradients(loss_fn, state["params"], batch, rng, accum)
    if param_shardings is not None:
        grads = jax.lax.with_sharding_constraint(grads, param_shardings)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)

    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    updated = (optax.apply_updates(state["params"], updates), opt_state)
    params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated,
                                     (state["params"], state["opt_state"]))
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1, "rng": state["rng"]}
    metrics = {**metrics, "grad_norm": grad_norm, "learning_rate": schedule(state["step"]), "finite": finite,
               **(batch_metrics(batch, state["step"]) if batch_metrics else {})}
    return new_state, metrics


def shared_weights_read_once(params: dict, model_config, param_shardings) -> dict:
    """`params` with the weights that a step uses more than once read once, in the compute dtype, for all their uses:

    - the word table, which the lookup and the MLM head's projection share (ELECTRA's generator too). Cast for each
      use, XLA:TPU all-reduced each use's gradient on its own (data parallel on v5p: BERT-base 1.21x the ideal
      bytes, ModernBERT-base 1.26x); cast once, each chip adds them before the one all-reduce (1.00x).
    - ALBERT's shared layer, also gathered over fsdp before the layer loop. Read inside the loop, XLA:TPU gathers it
      again for every application (ALBERT-xxlarge on v5e-8 moved 6x FSDP's ideal) and sums its gradient over the
      applications in float32, which it then reduces in float32 (1.7x data parallelism's ideal on v5p).

    The price: those gradients are summed in the compute dtype. Under bfloat16 the shared layer's gradient is 0.94%
    from float32's instead of 0.86% (12 applications; docs/tpu.md); the word table's is as far as before
    (tests/test_mixed_precision.py bounds both)."""
    dtype = jnp.dtype(model_config.dtype)
    layers_shared = model_config.num_hidden_groups < model_config.num_hidden_layers

    def read(path, leaf, leaf_sharding):
        keys = [getattr(key, "key", None) for key in path]
        if "word_embeddings" in keys:
            return leaf.astype(dtype)
        if layers_shared and leaf.ndim >= 2 and "encoder" in keys:  # vectors (biases, LayerNorms) stay float32
            return jax.lax.with_sharding_constraint(leaf.astype(dtype), sharding.without_axis(leaf_sharding, "fsdp"))
        return leaf

    return jax.tree_util.tree_map_with_path(read, params, param_shardings)


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
    plan = batch_warmup.stages(config)
    clock = token_clock(plan, config.data.batch_size) if config.batch_warmup.start else None
    tx = optimizer_lib.make_optimizer(config.optimizer, config.total_steps, clock)
    schedule = optimizer_lib.learning_rate_schedule(config.optimizer, config.total_steps, clock)
    init_fn = functools.partial(initial_state, model, tx)
    boxed_state = jax.eval_shape(init_fn, jax.random.key(config.seed))
    state_shardings = sharding.mesh_shardings(boxed_state, mesh)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    model_loss = objectives.loss_fn(config, model)

    def loss_fn(params, *args, **kwargs):
        return model_loss(shared_weights_read_once(params, config.model, state_shardings["params"]), *args, **kwargs)

    step = jax.jit(
        sharding.laid_out(functools.partial(train_step, loss_fn=loss_fn, tx=tx, schedule=schedule,
                                            accum_steps={s.batch_size: s.micro_batches for s in plan},
                                            batch_metrics=functools.partial(pretraining_batch_metrics,
                                                                            masking=config.masking),
                                            param_shardings=state_shardings["params"]),
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
    if config.data.example_kind not in PAIR_KINDS:
        shapes["packing_segment_ids"] = (b, s)
    batch_sharding = sharding.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding) for k, shape in shapes.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, batches_fn=None) -> dict:
    """Pretrain config.model on config.objective until config.total_steps; returns the final state.

    `batches_fn(config, start_step, process_index, process_count)` yields this host's numpy batches (default: the
    input pipeline); tests pass synthetic ones. Everything that can be checked without compute is checked before
    the workdir is created.
    """
    process_index, process_count = jax.process_index(), jax.process_count()
    if config.compilation_cache_dir:
        enable_compilation_cache(config.compilation_cache_dir)

    # ---- Checks that write nothing: init_from, config, mesh, workdir, data -----------------------------------------
    check_objective(config)  # init_from reads it
    config, pretrained = init_from.resolve(config)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    validate(config, mesh)
    workdir_lib.check(workdir, config)
    batches_fn = batches_fn or pretraining_data(config, process_index, process_count)
    run_loop.announce("process %d of %d, %d local / %d global devices; mesh %s", process_index, process_count,
                      jax.local_device_count(), jax.device_count(), dict(mesh.shape))
    workdir = workdir_lib.create(workdir, config)

    # ---- Model, optimizer, abstract state and its shardings from the logical rules ------------------------------
    program = build_program(config, mesh)
    run_loop.announce("%s: %.2fM parameters; %s attention while training, %s compute", type(program.model).__name__,
                      program.parameter_count / 1e6, attention_kernel(config.model, deterministic=False),
                      config.model.dtype)

    # ---- Restore the newest readable checkpoint, or initialise in place on the mesh (from init_from if given) ----
    manager = checkpoints.checkpoint_manager(workdir, config.keep_checkpoints)
    start_step, state = checkpoints.restore_latest(manager, program.abstract_state)
    if start_step:
        run_loop.announce("resuming from %s at step %d%s", manager.directory, start_step,
                          f" (config.init_from={config.init_from} is not read again)" if pretrained else "")
    else:
        state = jax.jit(lambda rng: nn.unbox(program.init_fn(rng)), out_shardings=program.state_shardings)(
            jax.random.key(config.seed))
        if pretrained:
            state["params"], report = init_from.initial_params(state["params"], pretrained, config)
            run_loop.announce("%s", report)
            if config.init_from_optimizer:
                state["opt_state"], report = init_from.carried_optimizer_state(state["opt_state"], config)
                run_loop.announce("%s", report)
    if start_step >= config.total_steps:
        run_loop.announce("step %d: config.total_steps=%d already reached", start_step, config.total_steps)
        checkpoints.finish_saves(manager)
        return state

    # ---- Data: batch i is a pure function of (seed, i), so resuming needs only the step ------------------------
    batch_sharding = sharding.batch_sharding(mesh)
    batches = (global_batch(b, batch_sharding) for b in batches_fn(config, start_step, process_index, process_count))
    evaluate = None
    if config.eval_every_steps:
        eval_config = ml_collections.ConfigDict(config.to_dict())
        eval_config.seed = config.seed + 1  # another example order and other masks than training sees
        eval_config.batch_warmup.start = 0  # full batches
        eval_batches = [global_batch(b, batch_sharding)
                        for b in itertools.islice(batches_fn(eval_config, 0, process_index, process_count),
                                                  config.eval_steps)]

        def evaluate(state):
            results = jax.device_get([program.evaluate(state["params"], b) for b in eval_batches])
            return {f"eval_{k}": float(np.mean([r[k] for r in results])) for k in results[0]}

    throughput = run_loop.Throughput(batch_size=config.data.batch_size,
                                     tokens_per_step=config.data.batch_size * config.data.seq_length,
                                     flops_per_step=flops.train_step_flops(config),
                                     peak_flops=(config.peak_flops or measured_peak_flops()) * mesh.size)
    run_loop.announce("model FLOPs per step %.3g; peak %.3g FLOP/s over %d devices", throughput.flops_per_step,
                      throughput.peak_flops, mesh.size)
    schedule = run_loop.Schedule.of(config, config.total_steps, config.eval_every_steps)
    return run_loop.run(state, start_step, batches, program.step, schedule, workdir, manager, evaluate,
                        throughput).state


flags.DEFINE_string("workdir", None, "Where config.json, checkpoints/, metrics.jsonl and tensorboard/ go: a "
                    "local folder or a bucket URL (gs://...).", required=True)
config_flags.DEFINE_config_file("config", None, "configs/<family>.py:<size>", lock_config=True)
flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the cluster detected from the "
                  "environment (TPU pod slices, SLURM, Open MPI).")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0, for a multi-process run without a "
                    "detectable cluster; needs --num_processes and --process_id.")
flags.DEFINE_integer("num_processes", None, "Processes in a --coordinator_address run.")
flags.DEFINE_integer("process_id", None, "This process's index in a --coordinator_address run.")


def command(train_fn):
    """The absl main of a training command (pretraining, fine-tuning): multi-host initialisation, then
    train_fn(--config, --workdir). bert_jax.cli turns user errors into one line; without --verbosity the native
    libraries' stderr is reduced to the one line of a fatal error (bert_jax.native_stderr), and bert_jax.pod ends
    every process of a multi-process run when one fails."""

    def main(argv):
        del argv
        config = flags.FLAGS.config
        if not cli.verbose():
            native_stderr.start()
        if flags.FLAGS.coordinator_address or flags.FLAGS.distributed:
            pod.start(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes, flags.FLAGS.process_id,
                      config.distributed.peer_timeout_s)
        train_fn(config, flags.FLAGS.workdir)

    return main


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    cli.run(command(train_and_evaluate))
