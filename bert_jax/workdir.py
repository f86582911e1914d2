"""A run's workdir: what train and finetune write there, and the checks made before they write anything.

    config.json      the whole config of the run (what a resume checks the model against)
    checkpoints/     Orbax steps (see bert_jax.checkpoints)
    metrics.jsonl    one row per logged step; tensorboard/ the same as event files
    results.json     fine-tuning's final scores; predictions/ (GLUE) or predictions.json (SQuAD) its predictions
    summary.json     the comparison's record of a finished pretraining run; seconds.json of a fine-tune
    tokenizer/       an embedding run's copy of its tokenizer, so that the workdir loads as a model by itself

A workdir is never a model folder: a folder holding anything else (an HF model, a tokenizer, an export) is refused
before a byte is written, so that a path meant for --config.init_from is never overwritten.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import pod, storage
from bert_jax.errors import UserError

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
RESULTS_FILE = "results.json"
SUMMARY_FILE = "summary.json"
SECONDS_FILE = "seconds.json"
TOKENIZER_DIR = "tokenizer"
RUN_FILES = frozenset({CONFIG_FILE, CHECKPOINT_DIR, METRICS_FILE, TENSORBOARD_DIR, RESULTS_FILE, "predictions",
                       "predictions.json", SUMMARY_FILE, SECONDS_FILE, TOKENIZER_DIR})
# Execution switches: changing them between runs keeps the parameters loadable (scan_layers changes the layout).
EXECUTION_KEYS = ("dtype", "remat_policy", "attention_impl")


class CheckpointMismatchError(UserError, ValueError):
    """The workdir holds a checkpoint of a different model than the config asks for."""


class WorkdirError(UserError, OSError):
    """A workdir the run cannot use; the message names it and what to do."""


def check(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> storage.Path:
    """Every check of the workdir that writes nothing: it holds only what a run like this one writes, and its
    checkpoints are of the configured model."""
    workdir = storage.as_path(workdir)
    if not workdir.exists():
        return workdir
    if not workdir.is_dir():
        raise WorkdirError(f"--workdir={workdir} is a file; give a folder (new or from an earlier run)")
    foreign = sorted(p.name for p in workdir.iterdir() if p.name not in RUN_FILES and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise WorkdirError(f"--workdir={workdir} holds files a run did not write ({shown}); a model folder is read "
                           f"with --config.init_from={workdir} (fine-tuning: --config.init), and the run needs a new "
                           "or empty --workdir")
    check_config_file(workdir, config)
    check_same_model(workdir, config)
    return workdir


def check_config_file(workdir: storage.Path, config: ml_collections.ConfigDict) -> None:
    """config.json, if there, must be a config of this kind of run (not a model's config.json or an export's)."""
    config_file = workdir / CONFIG_FILE
    if not config_file.exists():
        return
    try:
        stored = json.loads(config_file.read_text())
    except json.JSONDecodeError:
        stored = None
    if not isinstance(stored, dict):
        problem = "it is not a JSON object"
    elif set(stored) - set(config):
        problem = f"it has keys this run does not, e.g. {sorted(set(stored) - set(config))[:3]}"
    elif stored.get("objective") != config.objective:
        problem = f"its objective is {stored.get('objective')!r}"
    else:
        return
    raise WorkdirError(f"{config_file} is not the config of a {config.objective} run ({problem}); if {workdir} "
                       "is a model, pass it as --config.init_from (fine-tuning: --config.init) and use a new "
                       "--workdir")


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


def has_checkpoints(workdir: str | os.PathLike) -> bool:
    checkpoint_dir = storage.as_path(workdir) / CHECKPOINT_DIR
    return checkpoint_dir.is_dir() and any(p.name.isdigit() for p in checkpoint_dir.iterdir())


def check_same_model(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
    """Raise CheckpointMismatchError if the workdir's checkpoints were written for another model."""
    workdir = storage.as_path(workdir)
    config_file = workdir / CONFIG_FILE
    if not has_checkpoints(workdir):
        return
    if not config_file.exists():
        raise CheckpointMismatchError(f"{workdir / CHECKPOINT_DIR} holds checkpoints but {config_file} is missing, "
                                      "so their model cannot be checked; use a new --workdir")
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


def create(workdir: str | os.PathLike, config: ml_collections.ConfigDict) -> storage.Path:
    """Create the workdir (process 0) once every process has passed its checks, after checking that it can be
    written and that every process sees the same files there (a multi-host run needs a bucket or a filesystem all
    hosts mount), then write config.json."""
    workdir = storage.as_path(workdir)
    pod.agree("every process passed its checks")  # so that an error found by one process leaves no workdir behind
    if jax.process_index() == 0:
        storage.check_writable(workdir)
    check_shared(workdir)
    write_config(workdir, config)
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
    storage.forget_listings(workdir)  # check() listed it before the probe was there
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
