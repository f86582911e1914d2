"""A run's workdir: `config.json` and an Orbax CheckpointManager in `checkpoints/` with two items per step.

  params       the parameter pytree in the model's own layout (stacked under `layers` with scan_layers)
  train_state  optimizer state, step and the rng key data; with the config's seed, the step is also the input
               pipeline's position (batch i is a pure function of the seed and i)

A reader can restore "params" alone. Restores always go against an abstract target whose leaves carry the wanted
shardings, so a checkpoint written on one mesh loads on any other. Orbax writes each step to a temporary folder and
renames it when complete, so an interrupted or failed save (a full disk) leaves the last good step as it was.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bert_jax import storage

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
# Execution switches: changing them between runs keeps the parameters loadable (scan_layers changes the layout).
EXECUTION_KEYS = ("dtype", "remat_policy", "attention_impl")


class CheckpointMismatchError(ValueError):
    """The workdir holds a checkpoint of a different model than the config asks for."""


class WorkdirError(OSError):
    """A workdir the run cannot use; the message names it and what to do."""


def model_identity(config_dict: dict) -> dict:
    """What must match for a checkpoint to resume: the objective and the architecture. Model keys added after a
    checkpoint was written (e.g. param_dtype) take their defaults, so older workdirs still resume."""
    from bert_jax.config_lib import model_config

    model = {**model_config(config_dict["model"]["family"]).to_dict(), **config_dict["model"]}
    return {"objective": config_dict["objective"],
            "model": {k: v for k, v in model.items() if k not in EXECUTION_KEYS}}


def differences(a, b, prefix="") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix.rstrip(".")]
    return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{prefix}{k}.")]


def check_same_model(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
    """Raise CheckpointMismatchError if the workdir's checkpoints were written for another model."""
    workdir = storage.as_path(workdir)
    config_file, checkpoint_dir = workdir / CONFIG_FILE, workdir / CHECKPOINT_DIR
    has_checkpoints = checkpoint_dir.is_dir() and any(p.name.isdigit() for p in checkpoint_dir.iterdir())
    if not has_checkpoints:
        return
    if not config_file.exists():
        raise CheckpointMismatchError(f"{checkpoint_dir} holds checkpoints but {config_file} is missing, so their "
                                      "model cannot be checked; use a new --workdir")
    stored = model_identity(json.loads(config_file.read_text()))
    diff = differences(stored, model_identity(config.to_dict()))
    if diff:
        shown = ", ".join(f"{k}: {_lookup(stored, k)!r} there" for k in diff[:5])
        raise CheckpointMismatchError(f"{workdir} holds checkpoints of a different model ({shown}); resume with the "
                                      "same config.model and config.objective, or use a new --workdir")


def _lookup(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def prepare_workdir(workdir: str | os.PathLike) -> storage.Path:
    """Create the workdir (process 0) after checking that it can be written, and that every process sees the same
    files there: a multi-host run needs a bucket or a filesystem all hosts mount."""
    workdir = storage.as_path(workdir)
    if jax.process_index() == 0:
        storage.check_writable(workdir)
    check_shared(workdir)
    return workdir


def check_shared(workdir: storage.Path) -> None:
    """Raise WorkdirError if a file process 0 writes in the workdir is not visible to every other process."""
    if jax.process_count() == 1:
        return
    token = int(multihost_utils.broadcast_one_to_all(np.array(np.random.randint(1 << 30), np.int32)))
    probe = workdir / f".shared-probe-{token}"
    if jax.process_index() == 0:
        storage.atomic_write(probe, "")
    multihost_utils.sync_global_devices("bert_jax: shared-probe written")
    seen = multihost_utils.process_allgather(np.array(probe.exists()))
    multihost_utils.sync_global_devices("bert_jax: shared-probe read")
    if jax.process_index() == 0:
        probe.unlink(missing_ok=True)
    if not seen.all():
        blind = [i for i, ok in enumerate(seen) if not ok]
        raise WorkdirError(f"--workdir={workdir}: processes {blind} cannot see the files process 0 writes there (a "
                           "local disk per host?); use a bucket (gs://...) or a filesystem that every host mounts")


def write_config(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
    """Write config.json atomically (process 0 only), so a reader never sees half a file."""
    if jax.process_index() == 0:
        storage.atomic_write(storage.as_path(workdir) / CONFIG_FILE,
                             config.to_json_best_effort(indent=2, sort_keys=True))


def checkpoint_manager(workdir: str | os.PathLike, keep: int) -> ocp.CheckpointManager:
    """Async saves, keeping the `keep` latest steps; the trainer decides when to save.

    A step becomes visible only when complete (a renamed temporary folder; in a bucket, a commit_success.txt
    marker), so a process killed mid-save leaves the previous step as the latest."""
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           cleanup_tmp_directories=True)
    workdir = storage.as_path(workdir)
    return ocp.CheckpointManager((workdir if storage.is_remote(workdir) else workdir.absolute()) / CHECKPOINT_DIR,
                                 options=options, item_names=("params", "train_state"),
                                 item_handlers={name: ocp.StandardCheckpointHandler()
                                                for name in ("params", "train_state")})


def split_state(state: dict) -> tuple[dict, dict]:
    """(params, train_state): the two checkpoint items of a trainer state."""
    return state["params"], {k: v for k, v in state.items() if k != "params"}


def save(manager: ocp.CheckpointManager, step: int, state: dict) -> None:
    """Start an async save of the whole state; arrays are copied before this returns, so donation is safe."""
    params, train_state = split_state(state)
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                               train_state=ocp.args.StandardSave(train_state)), force=True)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: dict) -> dict:
    """The state at `step`, each leaf placed as its ShapeDtypeStruct's sharding says. A checkpoint written before
    the model padded its vocabulary resumes too: its vocabulary tensors (parameters and optimizer moments) grow
    with zero rows, which the padded logits never use."""
    rows = stored_vocab_rows(manager.item_metadata(step)["params"].tree)
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
