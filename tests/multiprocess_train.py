"""One process of a trainer run on CPU devices, spawned by test_train_multiprocess.py (not a test itself).

    python tests/multiprocess_train.py WORKDIR LOCAL_DEVICES PROCESS_COUNT PROCESS_ID COORDINATOR_PORT
"""
import sys

import jax

workdir, local_devices, process_count, process_id, port = sys.argv[1], *map(int, sys.argv[2:])
jax.config.update("jax_num_cpu_devices", local_devices)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if process_count > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}", process_count, process_id)

from bert_jax import train  # noqa: E402
from train_helpers import synthetic_batches, tiny_config  # noqa: E402

config = tiny_config("bert", total_steps=3, checkpoint_every_steps=3, **{"mesh.data": 2, "mesh.fsdp": 2})
train.train_and_evaluate(config, workdir, synthetic_batches)
