"""A bucket that fails now and then (tests/gcs_server.py's FlakyProxy: 429, 503 or a reset connection on a share of
the requests) changes nothing a run reads or writes there: the libraries' own retries (gcsfs for bert_jax's files
and Orbax's metadata, tensorstore's gcs_request_retries for the arrays) carry every operation through.

The I/O runs in a child process pointed at the proxy (this file run as a script); benchmarks/faults.py trains
through it and times an outage.
"""
import json
import os
import pathlib
import subprocess
import sys

from gcs_server import FlakyProxy

HERE = pathlib.Path(__file__).resolve()


def test_transient_faults_leave_checkpoints_metrics_and_shards_as_written(gcs_server, bucket_dir):
    proxy = FlakyProxy(gcs_server, rate=0.015, seed=8)
    try:
        child = subprocess.run([sys.executable, str(HERE), bucket_dir], capture_output=True, text=True, timeout=600,
                               env={**os.environ, **proxy.env()})
    finally:
        proxy.stop()
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.splitlines()[-1]) == {"checkpoint": True, "metrics": True, "records": True}
    assert min(proxy.faults.values()) > 0, proxy.faults  # every kind of fault was met, and gone through


def round_trips(bucket_dir: str) -> dict[str, bool]:
    """Save and restore a checkpoint, write metrics rows, write and read a shard; whether each came back whole."""
    import jax
    import numpy as np

    from bert_jax import checkpoints, storage
    from bert_jax.metrics_writer import MetricsWriter

    rng = np.random.default_rng(0)
    state = {"params": {"w": rng.standard_normal((64, 32), np.float32)}, "step": np.int32(3),
             "opt_state": {"mu": rng.standard_normal((64, 32), np.float32)}, "rng": np.arange(2, dtype=np.uint32)}
    run = f"{bucket_dir}/run"
    manager = checkpoints.checkpoint_manager(run, keep=2)
    checkpoints.save(manager, 3, state)
    checkpoints.finish_saves(manager)
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=cpu), state)
    step, restored = checkpoints.restore_latest(checkpoints.checkpoint_manager(run, keep=2), abstract)
    checkpoint = step == 3 and all(jax.tree.leaves(jax.tree.map(np.array_equal, restored, state)))

    writer = MetricsWriter(run)
    for row in range(1, 3):
        writer.write(row, {"loss": 1.0 / row})
    rows = [json.loads(line) for line in storage.as_path(f"{run}/metrics.jsonl").read_text().splitlines()]
    metrics = rows == [{"step": row, "loss": 1.0 / row} for row in range(1, 3)]

    records = [bytes(rng.integers(0, 256, 1000, np.uint8)) for _ in range(50)]
    storage.write_records(f"{bucket_dir}/shard.tfrecord", records)
    return {"checkpoint": checkpoint, "metrics": metrics,
            "records": list(storage.read_records(f"{bucket_dir}/shard.tfrecord")) == records}


if __name__ == "__main__":
    print(json.dumps(round_trips(sys.argv[1])))
