"""A run's checkpoints: an Orbax CheckpointManager in the workdir's `checkpoints/` with two items per step.

  params       the parameter pytree in the model's own layout (stacked under `layers` with scan_layers)
  train_state  optimizer state, step and the rng key data; with the config's seed, the step is also the input
               pipeline's position (batch i is a pure function of the seed and i)

A reader can restore "params" alone. Restores always go against an abstract target whose leaves carry the wanted
shardings, so a checkpoint written on one mesh loads on any other. Orbax writes each step to a temporary folder and
renames it when complete, so an interrupted or failed save (a full disk) leaves the last good step as it was.
"""
from __future__ import annotations

import errno
import functools
import json
import logging as std_logging
import os
import re
import sys
import threading
import traceback

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils
from orbax.checkpoint._src.metadata import array_metadata_store  # Orbax's default jax.Array handler has one

from bert_jax import storage
from bert_jax.errors import UserError, absl_warnings_off
from bert_jax.workdir import CHECKPOINT_DIR


HEALTH_FILE = "health.json"  # beside the step folders; Orbax lists only those
# Orbax shares the write of a replicated array among its replicas, each slicing its part out on its own device: one
# slice dispatched per array and replica at every save, and compiled per shape, offset and device at the first. Below
# this many bytes a replica, a write is too small for sharing to gain anything: one replica writes the array whole.
MIN_REPLICA_SLICE_BYTES = 1 << 16


class SaveError(UserError, OSError):
    """A checkpoint could not be written: the run stops at once, and the last good step stays for a rerun."""


class UnreadableCheckpointsError(UserError, OSError):
    """Checkpoints exist but none of them can be read; their files are left as they are."""


class Retention(ocp.checkpoint_managers.PreservationPolicy):
    """Which steps Orbax keeps: the `keep` newest, and those the run loop protects (bert_jax.health: the newest
    checkpoint shown good, and one from before the first skipped update)."""

    def __init__(self, keep: int):
        self.keep, self.protected = keep, set()

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        newest = {info.step for info in sorted(checkpoints, key=lambda info: info.step)[-self.keep:]}
        return [info.step in newest or info.step in self.protected for info in checkpoints]


def checkpoint_manager(workdir: str | os.PathLike, keep: int) -> ocp.CheckpointManager:
    """Async saves, keeping the `keep` latest steps and those `protect` names; the trainer decides when to save.

    A step becomes visible only when complete (a renamed temporary folder; in a bucket, a commit_success.txt
    marker), so a process killed mid-save leaves the previous step as the latest. A failed save reaches the caller
    as one SaveError (save, check_saves, finish_saves), so Orbax's logged tracebacks of it are left out."""
    quiet_reported_orbax_errors()
    write_small_arrays_whole()
    retention = Retention(keep)
    options = ocp.CheckpointManagerOptions(preservation_policy=retention, enable_async_checkpointing=True,
                                           cleanup_tmp_directories=True)
    manager = ocp.CheckpointManager(storage.orbax_path(workdir) / CHECKPOINT_DIR,
                                    options=options, item_names=("params", "train_state"),
                                    item_handlers={name: ocp.StandardCheckpointHandler()
                                                   for name in ("params", "train_state")})
    manager.retention = retention  # Orbax keeps the policy it was given but offers no way back to it
    return manager


@functools.cache
def write_small_arrays_whole() -> None:
    """Register Orbax's jax.Array handler (process-wide, as Orbax keeps it; once) with MIN_REPLICA_SLICE_BYTES. Without
    it, a tiny BERT's three saves on 8 devices compiled some 280 slices of biases, LayerNorms and small kernels
    (tests/test_train_mesh.py alone: 308 programs against 32, 37 s against 30); larger arrays are still shared."""
    handler = ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                             min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES)
    with absl_warnings_off():  # Orbax warns of the override
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def protect(manager: ocp.CheckpointManager, steps: set[int]) -> None:
    """Keep these steps whatever keep_checkpoints says (from the next save's clean-up on)."""
    manager.retention.protected = set(steps)


def read_health(manager: ocp.CheckpointManager) -> dict:
    """checkpoints/health.json (bert_jax.health's record), {} when there is none."""
    path = manager.directory / HEALTH_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_health(manager: ocp.CheckpointManager, record: dict) -> None:
    if jax.process_index() == 0:
        storage.atomic_write(manager.directory / HEALTH_FILE, json.dumps(record))


def split_state(state: dict) -> tuple[dict, dict]:
    """(params, train_state): the two checkpoint items of a trainer state."""
    return state["params"], {k: v for k, v in state.items() if k != "params"}


def quiet_reported_orbax_errors() -> None:
    """Leave out of the log and stderr what Orbax and TensorStore print about a failed save or read, which reaches
    the caller as one error; once per process. Records are filtered where they are written (the root logger's
    handlers, which absl's is one of, and the loggers Orbax's work reports through), so that none slips past on a
    path of its own: asyncio's unretrieved tasks, concurrent.futures' callbacks, threads that end in an error."""
    loggers = [std_logging.getLogger(name) for name in ("absl", "asyncio", "concurrent.futures")]
    for filtered in [*loggers, *std_logging.getLogger().handlers]:
        if without_orbax_tracebacks not in filtered.filters:
            filtered.addFilter(without_orbax_tracebacks)
    if not getattr(sys.unraisablehook, "drops_abandoned_async_work", False):
        previous = sys.unraisablehook

        def hook(unraisable):
            if not is_abandoned_async_work(unraisable):
                previous(unraisable)

        hook.drops_abandoned_async_work = True
        sys.unraisablehook = hook
    if not getattr(threading.excepthook, "drops_orbax_errors", False):
        previous_thread_hook = threading.excepthook

        def thread_hook(args):
            if logging.level_info() or not passes_through_orbax(args.exc_traceback):
                previous_thread_hook(args)

        thread_hook.drops_orbax_errors = True
        threading.excepthook = thread_hook


def is_abandoned_async_work(unraisable) -> bool:
    """Work Orbax abandons when a save or read fails, which Python reports as "Exception ignored" when it ends
    later: a TensorStore callback to the failed save's closed event loop, or a sibling read that raises again when
    its coroutine is collected."""
    error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    if code is not None:
        return f"{os.sep}orbax{os.sep}" in code.co_filename and isinstance(error.__context__, GeneratorExit)
    frames = traceback.extract_tb(unraisable.exc_traceback)
    late_callback = any(frame.name == "call_soon_threadsafe" for frame in frames)
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and late_callback


def without_orbax_tracebacks(record: std_logging.LogRecord) -> bool:
    """Log filter: Orbax logs a failed save with its traceback and TensorStore spec in each thread it passes, and
    asyncio logs the same error again for each of Orbax's write tasks nobody awaited ("Task exception was never
    retrieved"): hundreds of lines for a full disk, burying the cause, which reaches the caller as one SaveError.
    Those records are kept when absl logs at INFO (--verbosity)."""
    printed_trace = record.exc_info or "Traceback (most recent call last)" in record.getMessage()
    return not (printed_trace and from_orbax(record) and not logging.level_info())


def from_orbax(record: std_logging.LogRecord) -> bool:
    """Whether a log record with a traceback was written by Orbax or is about an error raised inside Orbax."""
    return (f"{os.sep}orbax{os.sep}" in record.pathname
            or bool(record.exc_info) and passes_through_orbax(record.exc_info[2]))


def passes_through_orbax(trace) -> bool:
    """Whether a traceback has a frame in Orbax's code."""
    return trace is not None and any(f"{os.sep}orbax{os.sep}" in frame.filename
                                     for frame in traceback.extract_tb(trace))


def save(manager: ocp.CheckpointManager, step: int, state: dict) -> None:
    """Start an async save of the whole state; arrays are copied before this returns, so donation is safe.

    Raises SaveError if the previous save failed (naming that step) or if this one cannot start."""
    wait_for_save(manager)
    params, train_state = split_state(state)
    try:
        manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                   train_state=ocp.args.StandardSave(train_state)), force=True)
    except Exception as error:
        raise save_error(manager, step, error) from error


def check_saves(manager: ocp.CheckpointManager) -> None:
    """Raise SaveError if the save in flight has already failed; cheap enough to call after every step."""
    if not manager.is_saving_in_progress():
        wait_for_save(manager)


def committed_step(manager: ocp.CheckpointManager) -> int | None:
    """The newest step whose save has completed (not the one in flight); None when there is none."""
    steps = sorted(manager.all_steps())
    if steps and manager.is_saving_in_progress():
        steps.pop()
    return steps[-1] if steps else None


def finish_saves(manager: ocp.CheckpointManager) -> None:
    """Wait for the save in flight and close the manager: a process that exits during a save floods stderr with
    the tracebacks of its writer threads (ending in `sys.meta_path is None`). Raises SaveError if that save failed."""
    try:
        wait_for_save(manager)
    finally:
        manager.close()


def wait_for_save(manager: ocp.CheckpointManager) -> None:
    """Block until the save in flight (if any) ends; SaveError naming its step if it failed."""
    in_flight = manager.latest_step()  # Orbax lists a step as soon as its save starts, and unlists it if it fails
    try:
        manager.wait_until_finished()
    except Exception as error:
        drain_failed_save(manager)
        raise save_error(manager, in_flight, error) from error


def drain_failed_save(manager: ocp.CheckpointManager) -> None:
    """Await the rest of a save that has failed. Orbax's finalize thread stops at the save's first error (its arrays)
    and leaves the checkpointer's own metadata write unawaited; on a full disk that write fails too, and its error
    would end the next save or `close()` in a raw traceback. Orbax has no public handle on that checkpointer."""
    checkpointer = manager._checkpointer  # pylint: disable=protected-access
    for _ in range(16):  # each call raises at most one of the save's few pending writes; bounded, so it cannot spin
        try:
            checkpointer.wait_until_finished()
            return
        except Exception:
            continue


def save_error(manager: ocp.CheckpointManager, step: int | None, error: BaseException) -> SaveError:
    """One line: the step, the folder, the cause in words, the last good step and what to do."""
    code = os_error_code(error)
    cause = os.strerror(code).lower() if code else first_line(root_cause(error))
    remedy = {errno.ENOSPC: "free space there", errno.EDQUOT: "free space there",
              errno.EACCES: "make the folder writable", errno.EPERM: "make the folder writable",
              errno.EROFS: "make the folder writable"}.get(code, "fix that")
    last_good = manager.latest_step()
    if last_good is None:
        kept, rerun = "no checkpoint was saved before it", "start again"
    else:
        kept, rerun = f"the last good checkpoint is step {last_good}", f"resume from step {last_good}"
    return SaveError(f"could not save step {step} in {manager.directory}: {cause}; {kept}. {remedy.capitalize()}, "
                     f"then rerun the same command to {rerun}")


def exception_chain(error: BaseException):
    """`error`, then what caused it, down to the first exception."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def root_cause(error: BaseException) -> BaseException:
    return list(exception_chain(error))[-1]


def os_error_code(error: BaseException) -> int | None:
    """The errno behind `error`: an OSError's, or the one TensorStore writes into its message (os_error_code=28)."""
    for link in exception_chain(error):
        if isinstance(link, OSError) and link.errno:
            return link.errno
        found = re.search(r"os_error_code='?(\d+)", str(link))
        if found:
            return int(found.group(1))
    return None


def first_line(error: BaseException, limit: int = 160) -> str:
    """The start of an error's message, without TensorStore's spec dump (nor a KeyError's quotes)."""
    message = str(error.args[0] if isinstance(error, KeyError) and error.args else error)
    text = (message.strip().splitlines() or [type(error).__name__])[0].split(" [tensorstore_spec=")[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def restore_latest(manager: ocp.CheckpointManager, abstract_state: dict) -> tuple[int, dict | None]:
    """(step, state) of the newest checkpoint that can be read, (0, None) when there is none.

    One that cannot be read (a file truncated or missing) is skipped with a warning and the next older one is
    tried. Once one is read, the skipped ones are moved aside whole to checkpoints/<step>.unreadable, which Orbax
    does not list, so the run can save those steps again and their files stay for a post-mortem. When none can
    be read nothing is moved and the error names them."""
    failures = {}
    for step in sorted(manager.all_steps(), reverse=True):
        state, reason = readable_state(manager, step, abstract_state)
        if state is not None:
            set_aside(manager, failures)
            return step, state
        failures[step] = reason
    if failures:
        listed = ", ".join(f"{step} ({reason})" for step, reason in failures.items())
        raise UnreadableCheckpointsError(f"{manager.directory}: no checkpoint can be read, steps {listed}; move "
                                         "those folders out of it to start from step 0, or use a new --workdir")
    return 0, None


def set_aside(manager: ocp.CheckpointManager, failures: dict[int, str]) -> None:
    """Move each unreadable step's folder to <step>.unreadable, with a warning naming why."""
    for (step, reason), name in zip(failures.items(), move_aside(manager, list(failures), "unreadable")):
        logging.warning("skipping the checkpoint of step %d in %s: %s; its files are kept in %s", step,
                        manager.directory, reason, name)


def move_aside(manager: ocp.CheckpointManager, steps: list[int], why: str) -> list[str]:
    """Move these steps' folders to <step>.<why> (or <step>.<why>-N), which Orbax does not list, so that the run
    resumes from an older step and may save these again; process 0 moves, then every process reloads. Returns the
    new names."""
    if not steps:
        return []
    names = []
    for step in steps:
        folder = manager.directory / str(step)
        aside, suffix = folder.parent / f"{step}.{why}", 1
        while aside.exists():
            aside, suffix = folder.parent / f"{step}.{why}-{suffix}", suffix + 1
        names.append(aside.name)
        if jax.process_index() == 0:
            storage.move_tree(folder, aside)
    multihost_utils.sync_global_devices(f"bert_jax: checkpoints moved aside as {why}")
    storage.forget_listings(manager.directory)
    manager.reload()
    return names


def readable_state(manager: ocp.CheckpointManager, step: int, abstract_state: dict) -> tuple[dict | None, str]:
    """(state, "") or (None, why it cannot be read, in a few words)."""
    try:
        return restore(manager, step, abstract_state), ""
    except Exception as error:  # noqa: BLE001 - TensorStore, JSON and Orbax raise their own types, bare Exception too
        return None, unreadable_reason(error)


UNREADABLE_REASONS = (("NOT_FOUND", "a file is missing"), ("OUT_OF_RANGE", "a file is truncated or missing"),
                      ("Truncated", "a file is truncated or missing"), ("DATA_LOSS", "a file is corrupt"),
                      ("FAILED_PRECONDITION", "a file is corrupt"), ("JSONDecodeError", "a metadata file is corrupt"),
                      ("FileNotFoundError", "a file is missing"))


def unreadable_reason(error: BaseException) -> str:
    """Why a checkpoint cannot be read, in a few words, rather than TensorStore's spec dump."""
    root = root_cause(error)
    described = f"{type(root).__name__}: {root}"
    return next((reason for marker, reason in UNREADABLE_REASONS if marker in described), first_line(root))


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict) -> dict:
    """The state at `step`, each leaf placed as its ShapeDtypeStruct's sharding says. A checkpoint written before
    the model padded its vocabulary resumes too: its vocabulary tensors (parameters and optimizer moments) grow
    with zero rows, which the padded logits never use."""
    stored = manager.item_metadata(step)["params"]
    if stored is None:
        raise FileNotFoundError(f"{manager.directory / str(step) / 'params'}: no parameter metadata")
    rows = stored_vocab_rows(stored.tree)
    target = unpadded_vocab_target(abstract_state, rows)
    params, train_state = split_state(target)
    restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(params),
                                                             train_state=ocp.args.StandardRestore(train_state)))
    state = {"params": restored["params"], **restored["train_state"]}
    return state if target is abstract_state else jax.device_put(pad_vocab_rows(state, abstract_state),
                                                                 jax.tree.map(lambda a: a.sharding, abstract_state))


def stored_vocab_rows(stored_params) -> int | None:
    """Rows of the word-embedding table in a checkpoint's parameter metadata (None if it has none)."""
    from flax import traverse_util

    for path, leaf in traverse_util.flatten_dict(stored_params).items():
        if path[-2:] == ("word_embeddings", "embedding"):
            return leaf.shape[0]
    return None


def unpadded_vocab_target(target, rows: int | None):
    """`target`, with its vocabulary tensors at `rows` rows on the CPU where the model has more (a checkpoint from
    before the vocabulary padding); `target` itself when the rows agree."""
    from bert_jax.modeling.transformer import map_vocab_params

    if rows is None or True not in jax.tree.leaves(map_vocab_params(target, lambda leaf: leaf.shape[0] > rows)):
        return target
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    return map_vocab_params(target, lambda leaf: jax.ShapeDtypeStruct((rows, *leaf.shape[1:]), leaf.dtype,
                                                                      sharding=cpu))


def pad_vocab_rows(tree, target):
    """Leaves of `tree` with fewer rows than `target`'s (what unpadded_vocab_target shrank) grown with zero rows."""
    def grow(x, wanted):
        if x.shape == wanted.shape:
            return x
        return np.pad(np.asarray(x), [(0, wanted.shape[0] - x.shape[0])] + [(0, 0)] * (x.ndim - 1))

    return jax.tree.map(grow, tree, target)


def abstract_tree(tree, shardings):
    """ShapeDtypeStructs carrying `shardings`: the restore target for a tree of arrays or ShapeDtypeStructs."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
