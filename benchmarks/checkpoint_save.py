"""How long a pretraining checkpoint takes to save, and how long of it the step loop waits: the input to choosing
config.checkpoint_every_secs on preemptible pods.

    python benchmarks/checkpoint_save.py [--model=bert-base] [--save_dir=DIR | --emulator] [--saves=3]

Saves the whole trainer state (parameters, Adam moments, step, rng) of the preset through bert_jax.checkpoints, as
the trainer does. --emulator saves into a bucket on a GCS server started on localhost (tests/gcs_server.py); it
measures the client side of a bucket save (serialisation, HTTP, the commit marker), not Cloud Storage's bandwidth.
The last line printed is JSON.
"""
import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for key, value in (("NO_GCE_CHECK", "true"), ("GCE_METADATA_HOST", "127.0.0.1:9"), ("GCE_METADATA_IP", "127.0.0.1:9")):
    os.environ.setdefault(key, value)  # no credentials lookup beyond this machine (see tests/conftest.py)

import jax  # noqa: E402
from flax import linen as nn  # noqa: E402

from bert_jax import checkpoints, config_lib, sharding  # noqa: E402
from bert_jax import optimizer as optimizer_lib  # noqa: E402
from bert_jax.modeling import count_params, pretraining_model  # noqa: E402
from bert_jax.train import initial_state  # noqa: E402

PARSER = argparse.ArgumentParser(description=__doc__.split("\n")[0])
PARSER.add_argument("--model", default="bert-base", help="<family>-<size> preset.")
PARSER.add_argument("--save_dir", default=None, help="Where to save (default: a new temporary folder).")
PARSER.add_argument("--emulator", action="store_true", help="Save into a bucket on a local GCS server instead.")
PARSER.add_argument("--saves", type=int, default=3, help="Saves to time (the mean is reported).")


def timed_saves(workdir, state, saves: int) -> tuple[list[float], list[float]]:
    """(seconds the caller is blocked by each save, seconds until each save is committed)."""
    manager = checkpoints.checkpoint_manager(workdir, keep=2)
    blocked, total = [], []
    for step in range(1, saves + 1):
        start = time.perf_counter()
        checkpoints.save(manager, step, state)
        blocked.append(time.perf_counter() - start)
        manager.wait_until_finished()
        total.append(time.perf_counter() - start)
    manager.close()
    return blocked, total


def main():
    FLAGS = PARSER.parse_args()
    family, size = FLAGS.model.split("-")
    config = config_lib.load_preset(family, size)
    model = pretraining_model(config)
    tx = optimizer_lib.make_optimizer(config.optimizer, config.total_steps)
    mesh = sharding.make_mesh(-1, 1, 1)
    boxed = jax.eval_shape(lambda rng: initial_state(model, tx, rng), jax.random.key(0))
    state = jax.jit(lambda rng: nn.unbox(initial_state(model, tx, rng)),
                    out_shardings=sharding.mesh_shardings(boxed, mesh))(jax.random.key(0))
    # Random values everywhere: a trained state's Adam moments do not compress like the zeros they start as. Each
    # keeps its sharding: on several devices Orbax shares a replicated array's write among its replicas.
    state = jax.tree.map(lambda x: jax.device_put(jax.random.normal(jax.random.key(1), x.shape, x.dtype), x.sharding)
                         if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x, state)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    server = None
    if FLAGS.emulator:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
        from gcs_server import GcsServer, use

        server = GcsServer()
        use(server)
        workdir = f"gs://{server.bucket}/checkpoint-benchmark"
    else:
        workdir = FLAGS.save_dir or tempfile.mkdtemp(prefix="checkpoint-benchmark-")
    try:
        blocked_each, total_each = timed_saves(workdir, state, FLAGS.saves)
    finally:
        if server:
            server.stop()
    blocked, total = sum(blocked_each) / FLAGS.saves, sum(total_each) / FLAGS.saves
    millions = count_params(boxed["params"], config.model) / 1e6
    print(f"{FLAGS.model}: {millions:.1f}M parameters, state {state_bytes / 1e9:.2f} GB; "
          f"{'bucket on a local GCS emulator' if FLAGS.emulator else workdir}: the loop waits {blocked:.2f} s, "
          f"the save commits after {total:.2f} s ({state_bytes / total / 1e6:.0f} MB/s); on {jax.device_count()} "
          f"devices, the first save blocks {blocked_each[0]:.2f} s (it compiles what the later ones reuse)")
    print(json.dumps({"model": FLAGS.model, "state_bytes": state_bytes, "target": "emulator" if FLAGS.emulator
                      else "local", "devices": jax.device_count(), "blocked_s": round(blocked, 3),
                      "first_blocked_s": round(blocked_each[0], 3), "save_s": round(total, 3),
                      "mb_per_s": round(state_bytes / total / 1e6, 1)}))


if __name__ == "__main__":
    main()
