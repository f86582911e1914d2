"""Training in phases (ModernBERT's 1024 -> 8192 context extension): a phase starts from the previous phase's workdir
with longer sequences, a new RoPE base and schedule; the parameters carry over, the optimizer state carries over or
restarts by config.init_from_optimizer, and a learned position table grows by copying (Longformer)."""
import jax
import numpy as np
import optax
import pytest
from train_helpers import override, synthetic_batches, tiny_config

from bert_jax import config_lib, modeling, train
from bert_jax.init_from import InitFromError, copied_positions, resolve

MESH = {"mesh.data": 2, "mesh.fsdp": 4}


def schedule_and_adam_counts(opt_state) -> tuple[int, int]:
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, (optax.ScaleByScheduleState,
                                                                        optax.ScaleByAdamState)))
    schedule = [int(x.count) for x in leaves if isinstance(x, optax.ScaleByScheduleState)]
    adam = [int(x.count) for x in leaves if isinstance(x, optax.ScaleByAdamState)]
    return schedule[0], adam[0]


def test_copied_positions_repeat_the_learned_rows_after_the_offset():
    table = np.arange(5 * 2).reshape(5, 2)  # 2 offset rows (RoBERTa's padding), 3 learned positions
    grown = copied_positions(table, 9, offset=2)
    assert grown.shape == (9, 2)
    np.testing.assert_array_equal(grown[:5], table)
    np.testing.assert_array_equal(grown[5:], table[[2, 3, 4, 2]])


def test_a_longer_phase_grows_the_table_and_carries_the_moments(tmp_path):
    phase1 = tiny_config("bert", **MESH, **{"model.max_position_embeddings": 32, "total_steps": 3})
    first = train.train_and_evaluate(phase1, str(tmp_path / "phase1"), synthetic_batches)
    assert schedule_and_adam_counts(first["opt_state"]) == (3, 3)

    phase2 = tiny_config("bert", **MESH, **{"data.seq_length": 64, "total_steps": 2, "init_from_optimizer": True,
                                          "init_from": str(tmp_path / "phase1"), "optimizer.learning_rate": 5e-4})
    second = train.train_and_evaluate(phase2, str(tmp_path / "phase2"), synthetic_batches)
    table = np.asarray(second["params"]["backbone"]["embeddings"]["position_embeddings"]["embedding"])
    assert table.shape[0] == 64
    # Rows 32..63 started as copies of rows 0..31; two small steps later they are still close to them.
    old = np.asarray(first["params"]["backbone"]["embeddings"]["position_embeddings"]["embedding"])
    np.testing.assert_allclose(table[32:], old, atol=5e-3)
    # The moments went on (Adam's count 3 + 2), the schedule started over with the phase (count 2).
    assert schedule_and_adam_counts(second["opt_state"]) == (2, 5)

    restarted = train.train_and_evaluate(override_copy(phase2, init_from_optimizer=False), str(tmp_path / "fresh"),
                                         synthetic_batches)
    assert schedule_and_adam_counts(restarted["opt_state"]) == (2, 2)

    with pytest.raises(InitFromError, match="config.optimizer.name='lamb' but the state in .* is of name='adamw'"):
        resolve(override_copy(phase2, **{"optimizer.name": "lamb"}))


def override_copy(config, **settings):
    copy = config_lib.lock(type(config)(config.to_dict()))
    return override(copy, settings)


def test_a_phase_sets_the_rope_base_and_otherwise_keeps_the_checkpoints(tmp_path):
    """A released ModernBERT holds theta 160k: continued pretraining keeps it, a phase that names another sets it."""
    import bert_jax
    from bert_jax.pretrained import Pretrained

    model = config_lib.load_preset("modernbert", "tiny").model
    model.global_rope_theta = 160_000.0
    params = modeling.init_params(modeling.model_for_head(model, "masked_lm"), jax.random.key(0))
    bert_jax.save_pretrained(Pretrained(config=model, head="masked_lm", params=params), tmp_path / "release",
                             format="hf")
    config = config_lib.load_preset("modernbert", "tiny")  # the phase-1 preset: theta 10k
    config.init_from = str(tmp_path / "release")
    assert resolve(config)[0].model.global_rope_theta == 160_000.0
    config.model.global_rope_theta = 320_000.0
    assert resolve(config)[0].model.global_rope_theta == 320_000.0

    config.init_from_optimizer = True
    with pytest.raises(InitFromError, match="init_from_optimizer=True needs config.init_from to be a bert_jax workdir"):
        resolve(config)
