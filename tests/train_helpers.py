"""Shared by the trainer tests: small configs, synthetic batches that are a pure function of (seed, step), and
programs compiled as a user's run compiles them.

Synthetic batches let a 2-process run see exactly the rows a 1-process run sees (the real pipeline gives each host
its own files), and keep tests that are about sharding or checkpoints independent of the corpus.
"""
from __future__ import annotations

import itertools
import os
import signal

import numpy as np

from bert_jax import config_lib

SEQ_LENGTH, PREDICTIONS, VOCAB = 32, 5, 1000

# The session's compilation cache (tests/conftest.py), for the commands tests start with an environment of their own.
XLA_CACHE_DIR = os.environ["JAX_COMPILATION_CACHE_DIR"]


# The suite compiles with XLA:CPU's older fusion emitters (tests/conftest.py); a user's run gets the default ones.
USERS_EMITTERS = {"xla_cpu_use_fusion_emitters": True}


def as_users_compile(jitted, *args, **kwargs):
    """jitted(*args, **kwargs), compiled with XLA:CPU's default emitters: for the tests whose subject is the exact
    numbers a user's run computes (parity with transformers, bit-exact donation)."""
    return jitted.lower(*args, **kwargs).compile(USERS_EMITTERS)(*args, **kwargs)


def tiny_config(family: str = "bert", **overrides):
    """The family's tiny preset with a short sequence, a small batch and a few quickly logged steps."""
    config = config_lib.load_preset(family, "tiny")
    settings = {"data.seq_length": SEQ_LENGTH, "data.batch_size": 8, "masking.max_predictions_per_seq": PREDICTIONS,
                "total_steps": 4, "log_every_steps": 1, "checkpoint_every_steps": 2, "eval_every_steps": 0,
                "optimizer.warmup_steps": 1, "peak_flops": 1e9, **overrides}
    return override(config, settings)


def override(config, settings: dict):
    """Set dotted keys ("data.seq_length": 32) as --config.KEY=VALUE flags would; returns the config."""
    for key, value in settings.items():
        *sections, name = key.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[name] = value
    return config


def global_batch_at(config, step: int, weights_dtype=np.int32) -> dict:
    """The whole batch of `step`: random tokens after [CLS], a random length, PREDICTIONS masked positions."""
    rs = np.random.RandomState([config.seed, step])
    b, s = config.data.batch_size, config.data.seq_length
    lengths = rs.randint(s // 2, s + 1, size=b)
    mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    ids = rs.randint(5, VOCAB, size=(b, s)).astype(np.int32) * mask
    ids[:, 0] = 2
    positions = np.stack([np.sort(rs.choice(np.arange(1, n), PREDICTIONS, replace=False)) for n in lengths])
    weights = np.ones((b, PREDICTIONS), weights_dtype)
    weights[:, -1] = rs.randint(0, 2, size=b)  # some padded predictions
    labels = np.take_along_axis(ids, positions, 1) * weights.astype(np.int32)
    masked_ids = ids.copy()
    np.put_along_axis(masked_ids, positions, 4, axis=1)
    segments = (np.arange(s)[None] >= lengths[:, None] // 2).astype(np.int32) * mask
    sentence_labels = rs.randint(0, 2, size=b).astype(np.int32)
    return {"input_ids": masked_ids, "input_mask": mask, "segment_ids": segments,
            "masked_lm_positions": (positions * weights.astype(np.int32)).astype(np.int32),
            "masked_lm_ids": labels.astype(np.int32), "masked_lm_weights": weights,
            "next_sentence_labels": sentence_labels, "sentence_order_labels": sentence_labels}


def synthetic_batches(config, start_step: int, process_index: int, process_count: int):
    """This host's rows of global_batch_at(step) for step = start_step, start_step + 1, ..."""
    local = config.data.batch_size // process_count
    for step in itertools.count(start_step):
        batch = global_batch_at(config, step)
        yield {k: v[process_index * local:(process_index + 1) * local] for k, v in batch.items()}


def signalled_at(stop_step: int, batches_fn=None):
    """`batches_fn` (default synthetic_batches) sending this process SIGTERM while the batch of step `stop_step` is
    being fetched: the run saves and stops after that step."""
    batches_fn = batches_fn or synthetic_batches

    def batches(config, start_step, process_index, process_count):
        for step, batch in enumerate(batches_fn(config, start_step, process_index, process_count), start_step):
            if step == stop_step - 1:
                os.kill(os.getpid(), signal.SIGTERM)
            yield batch
    return batches


def rows_signalled_at(stop_step: int, batch_rows):
    """finetune.batch_rows sending this process SIGTERM when the rows of step `stop_step` are fetched: a fine-tuning
    or embedding run saves and stops after that step."""
    def rows(num_rows, batch_size, seed, step):
        if step == stop_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch_rows(num_rows, batch_size, seed, step)
    return rows


def logged(workdir, key: str = "loss") -> dict[int, float]:
    """{step: value} of one metric from a run's metrics.jsonl."""
    import json
    import pathlib

    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row[key] for row in rows if key in row}
