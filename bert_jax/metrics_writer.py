"""Logged metrics go to `metrics.jsonl` (one JSON object per logged step) and TensorBoard event files in the workdir.

Only process 0 writes. Scalars are written with TensorFlow's summary op and the "scalars" plugin metadata, which
is what `tf.summary.scalar` does, without needing the tensorboard package installed.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform

import jax

METRICS_FILE = "metrics.jsonl"


def machine_description() -> str:
    """CPU model, core count, OS and Python: where a reported figure was measured."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return (f"{names[0] if names else platform.processor()}, {os.cpu_count()} CPUs, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}")


class MetricsWriter:
    def __init__(self, workdir: str | os.PathLike):
        self.active = jax.process_index() == 0
        if not self.active:
            return
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self._tf = tf
        self._jsonl = open(pathlib.Path(workdir) / METRICS_FILE, "a", encoding="utf-8")
        self._events = tf.summary.create_file_writer(str(pathlib.Path(workdir) / "tensorboard"))
        self._scalar = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.active:
            return
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self._jsonl.flush()
        with self._events.as_default():
            for name, value in metrics.items():
                self._tf.summary.write(name, self._tf.constant(value, self._tf.float32), step=step,
                                       metadata=self._scalar)
        self._events.flush()

    def close(self) -> None:
        if self.active:
            self._jsonl.close()
            self._events.close()
