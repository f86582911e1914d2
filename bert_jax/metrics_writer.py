"""Logged metrics go to `metrics.jsonl` (one JSON object per logged step) and TensorBoard event files in the workdir.

Only process 0 writes. Scalars are written as `tf.summary.scalar` writes them (the "scalars" plugin metadata), with
TensorFlow's protos but bert_jax's own file writes, so the workdir may be a bucket (see bert_jax.storage).
"""
from __future__ import annotations

import errno
import json
import os
import pathlib
import platform
import socket
import time

import jax

from bert_jax import storage
from bert_jax.errors import UserError
from bert_jax.workdir import METRICS_FILE, TENSORBOARD_DIR



def machine_description() -> str:
    """CPU model, core count, OS and Python: where a reported figure was measured."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return (f"{names[0] if names else platform.processor()}, {os.cpu_count()} CPUs, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}")


class MetricsWriteError(UserError, OSError):
    """metrics.jsonl or the event file could not be written; the run stops (its checkpoints are as they were)."""


def write_error(path: storage.Path, error: BaseException) -> MetricsWriteError:
    """One line: the file, the cause in words, what to do."""
    from bert_jax import checkpoints

    code = checkpoints.os_error_code(error)
    cause = os.strerror(code).lower() if code else checkpoints.first_line(checkpoints.root_cause(error))
    remedy = "free space there" if code in (errno.ENOSPC, errno.EDQUOT) else "fix that"
    return MetricsWriteError(f"could not write {path}: {cause}; {remedy}")


class MetricsWriter:
    """metrics.jsonl and a TensorBoard event file, rewritten whole at every write (a bucket object cannot be appended
    to; TensorFlow's own GCS writer re-uploads its event file the same way). A resumed run keeps the rows up to its
    start step and drops later ones, so no step is logged twice."""

    def __init__(self, workdir: str | os.PathLike, start_step: int = 0):
        self.active = jax.process_index() == 0
        if not self.active:
            return
        from tensorflow.core.framework import summary_pb2  # TensorFlow loads only on the process that writes
        from tensorflow.core.util import event_pb2

        workdir = storage.as_path(workdir)
        self._jsonl = workdir / METRICS_FILE
        self._rows = [line + "\n" for line in (self._jsonl.read_text().splitlines() if self._jsonl.exists() else [])
                      if line.strip() and json.loads(line)["step"] <= start_step]
        self._events_file = workdir / TENSORBOARD_DIR / (
            f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2")
        storage.make_dirs(self._events_file.parent)
        self._events = bytearray(storage.framed(event_pb2.Event(wall_time=time.time(),
                                                                 file_version="brain.Event:2").SerializeToString()))
        self._scalar = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)

    def write(self, step: int, metrics: dict[str, float], notes: dict | None = None) -> None:
        """Add a row; metrics of a step that already has the last row (an evaluation after the step's training
        metrics, a rerun's final evaluation) join that row, so each step has one. `notes` (not scalars, e.g. the
        steps whose update was skipped) go to metrics.jsonl only. A write that fails is a MetricsWriteError."""
        if not self.active:
            return
        last = json.loads(self._rows[-1]) if self._rows else {}
        row = {**last, **metrics, **(notes or {})} if last.get("step") == step else {**metrics, **(notes or {})}
        if last.get("step") == step:
            self._rows.pop()
        self._rows.append(json.dumps({"step": step, **{k: v for k, v in row.items() if k != "step"}}) + "\n")
        events = b"".join(storage.framed(self._scalar_event(step, name, value).SerializeToString())
                          for name, value in metrics.items())
        self._write(self._jsonl, "".join(self._rows))
        self._events += events
        self._write(self._events_file, bytes(self._events))

    def _write(self, path: storage.Path, data) -> None:
        try:
            storage.atomic_write(path, data)
        except Exception as error:  # noqa: BLE001 - OSError locally; fsspec's and gcsfs' own errors in a bucket
            raise write_error(path, error) from error

    def _scalar_event(self, step: int, name: str, value: float):
        """What tf.summary.scalar writes: a float32 scalar tensor tagged with the scalars plugin."""
        from tensorflow.core.framework import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorflow.core.util import event_pb2

        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto())
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=name, tensor=tensor,
                                                                       metadata=self._scalar)])
        return event_pb2.Event(wall_time=time.time(), step=step, summary=summary)

    def close(self) -> None:
        """Every write is already complete; kept so callers close writers as they would a file."""
