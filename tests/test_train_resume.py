"""Checkpoints: exact resume after a signal, restore onto other meshes, model mismatch, NaN handling."""
import json
import os
import re
import signal

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_helpers import global_batch_at, logged, signalled_at, synthetic_batches, tiny_config

from bert_jax import checkpoints, health, train
from bert_jax import workdir as workdir_lib

MESH = {"mesh.data": 2, "mesh.fsdp": 4, "mesh.tensor": 1}


def assert_trees_equal(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_resume_is_exact_and_restores_onto_other_meshes(tmp_path):
    config = tiny_config("bert", **MESH)
    straight = train.train_and_evaluate(config, str(tmp_path / "straight"), synthetic_batches)

    resumed_dir = str(tmp_path / "resumed")
    halfway = train.train_and_evaluate(config, resumed_dir, signalled_at(2))
    assert int(halfway["step"]) == 2 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    # What a save killed half-way leaves behind (Orbax renames a step's folder only once it is complete).
    partial = tmp_path / "resumed" / "checkpoints" / "3.orbax-checkpoint-tmp-1"
    partial.mkdir()
    (partial / "_CHECKPOINT_METADATA").write_text("{trunc")
    resumed = train.train_and_evaluate(config, resumed_dir, synthetic_batches)
    assert int(resumed["step"]) == 4
    assert_trees_equal(straight, resumed)  # params, optimizer state, step and rng: bit for bit
    assert logged(tmp_path / "straight") == logged(resumed_dir)

    # The same checkpoint on an (8, 1, 1) mesh: the run restores it and finds nothing left to do.
    on_data_mesh = train.train_and_evaluate(tiny_config("bert", **{"mesh.data": 8}), resumed_dir, synthetic_batches)
    assert_trees_equal(straight["params"], on_data_mesh["params"])
    kernel = on_data_mesh["params"]["backbone"]["pooler"]["kernel"]
    assert dict(kernel.sharding.mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert kernel.sharding.is_fully_replicated
    assert not straight["params"]["backbone"]["pooler"]["kernel"].sharding.is_fully_replicated  # fsdp=4 split it

    # A reader restores "params" alone onto one device.
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_device), straight["params"])
    with ocp.CheckpointManager(os.path.join(resumed_dir, "checkpoints"), item_names=("params", "train_state")) as m:
        params = m.restore(4, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))["params"]
    assert_trees_equal(straight["params"], params)
    assert jax.tree.leaves(params)[0].sharding == one_device

    with pytest.raises(workdir_lib.CheckpointMismatchError, match="model.hidden_size: 64 there"):
        train.train_and_evaluate(tiny_config("bert", **{"model.hidden_size": 128, **MESH}), resumed_dir,
                                 synthetic_batches)


def test_replicated_arrays_are_shared_among_replicas_only_when_large(tmp_path):
    """Orbax shares a replicated array's write among its replicas, each slicing its part out on its own device (one
    compile per shape, offset and device); below checkpoints.MIN_REPLICA_SLICE_BYTES a replica, one replica writes
    it whole. What was written shows in each array's write shape, and everything restores as saved."""
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("data",)),
                                            jax.sharding.PartitionSpec())
    replicas = len(jax.devices())
    rows_at_threshold = replicas * checkpoints.MIN_REPLICA_SLICE_BYTES // (4 * 128)
    shapes = {"large": (rows_at_threshold, 128), "small": (rows_at_threshold - replicas, 128), "bias": (128,)}
    params = {name: jax.device_put(np.random.RandomState(i).standard_normal(shape).astype(np.float32), replicated)
              for i, (name, shape) in enumerate(shapes.items())}
    with checkpoints.checkpoint_manager(tmp_path, keep=1) as manager:
        checkpoints.save(manager, 1, {"params": params, "step": np.int32(1)})
        checkpoints.finish_saves(manager)
        written = {name: meta.storage.write_shape for name, meta in manager.item_metadata(1)["params"].items()}
        step = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
        _, restored = checkpoints.restore_latest(manager, {"params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params), "step": step})
    assert written == {"large": (rows_at_threshold // replicas, 128), **{k: shapes[k] for k in ("small", "bias")}}
    assert_trees_equal(params, restored["params"])


def poisoned_at(bad_step: int):
    """Batches with float weights, NaN in the batch of step `bad_step`: that step's loss is NaN."""
    def batches(config, start_step, process_index, process_count):
        for step in range(start_step, 1 << 30):
            batch = global_batch_at(config, step, weights_dtype=np.float32)
            if step == bad_step - 1:
                batch["masked_lm_weights"][0, 0] = np.nan
            yield batch
    return batches


def test_nan_loss_stops_or_skips(tmp_path):
    """Under stop, the checkpoint the NaN step judged (step 2, its parameters gave the NaN) is moved aside and the
    line names step 1, which step 2 showed good; under skip the update is dropped and logged with its reason."""
    config = tiny_config("bert", checkpoint_every_steps=1, **MESH)
    with pytest.raises(health.DivergenceError, match=re.escape(
            "step 3: the loss is nan; stopped, the last good checkpoint is step 1 (2.diverged moved aside, their "
            "files kept).")):
        train.train_and_evaluate(config, str(tmp_path / "stop"), poisoned_at(3))
    manager = checkpoints.checkpoint_manager(tmp_path / "stop", keep=3)
    assert manager.all_steps() == [1] and (tmp_path / "stop" / "checkpoints" / "2.diverged" / "params").is_dir()
    saved = manager.restore(1, args=ocp.args.Composite(params=ocp.args.StandardRestore()))["params"]
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(saved))
    manager.close()

    config.nan_policy = "skip"
    state = train.train_and_evaluate(config, str(tmp_path / "skip"), poisoned_at(3))
    assert int(state["step"]) == 4 and all(np.isfinite(x).all() for x in jax.tree.leaves(state["params"]))
    assert logged(tmp_path / "skip", "skipped_updates") == {1: 0, 2: 0, 3: 1, 4: 1}
    assert logged(tmp_path / "skip", "skipped_steps") == {3: [{"step": 3, "reason": "the loss is nan"}]}


def test_checkpoints_from_before_the_vocabulary_padding_resume(tmp_path):
    """A run saved when the word table had vocab_size rows (30522, before it was padded to 30720) continues, with
    the same losses as a run that always had the padding: padded rows get no gradient and are never predicted."""
    from bert_jax.modeling.transformer import unpad_vocab

    config = tiny_config("bert", **MESH)
    straight_dir, old_dir = str(tmp_path / "straight"), str(tmp_path / "old")
    train.train_and_evaluate(config, straight_dir, synthetic_batches)
    halfway = train.train_and_evaluate(config, old_dir, signalled_at(2))
    old_state = jax.tree.map(np.asarray, {"params": unpad_vocab(halfway["params"], config.model),
                                          "opt_state": unpad_vocab(halfway["opt_state"], config.model),
                                          "step": halfway["step"], "rng": halfway["rng"]})
    assert old_state["params"]["backbone"]["embeddings"]["word_embeddings"]["embedding"].shape[0] == 30522
    with checkpoints.checkpoint_manager(old_dir, keep=3) as manager:
        manager.delete(2)
        checkpoints.save(manager, 2, old_state)
        manager.wait_until_finished()

    config_file = tmp_path / "old" / "config.json"  # and before config.model.param_dtype existed
    written = json.loads(config_file.read_text())
    del written["model"]["param_dtype"]
    config_file.write_text(json.dumps(written))

    resumed = train.train_and_evaluate(config, old_dir, synthetic_batches)
    assert int(resumed["step"]) == 4
    assert logged(straight_dir) == logged(old_dir)
    assert resumed["params"]["backbone"]["embeddings"]["word_embeddings"]["embedding"].shape[0] == 30720
