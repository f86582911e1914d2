"""Batch-size warmup by tokens: the staircase of sizes, at most `stages` compiled steps, the learning rate following
the tokens, and a resume across a size change that is bit-identical to a run never stopped (real pipeline)."""
import jax
import numpy as np
import pytest
from train_helpers import logged, override, signalled_at

from bert_jax import batch_warmup, config_lib, train

# seq 32, batch 8 -> 32 over 3072 tokens in 4 sizes: 8, 16, 24, 32 (4, 2, 2 steps of warmup, then full batches).
WARMUP = {"data.seq_length": 32, "data.batch_size": 32, "masking.max_predictions_per_seq": 10,
          "batch_warmup.start": 8, "batch_warmup.tokens": 3072, "total_steps": 10, "log_every_steps": 1,
          "checkpoint_every_steps": 100, "eval_every_steps": 0, "optimizer.warmup_steps": 6, "peak_flops": 1e9}


def warmup_config(**settings):
    return override(config_lib.load_preset("modernbert", "tiny"), {**WARMUP, **settings})


def test_the_batch_grows_in_a_staircase_of_at_most_stages_sizes():
    config = warmup_config()
    plan = batch_warmup.stages(config)
    assert [(s.first_step, s.batch_size, s.micro_batches) for s in plan] == [(0, 8, 1), (4, 16, 1), (6, 24, 1),
                                                                             (8, 32, 1)]
    sizes = [batch_warmup.stage_at(plan, step).batch_size for step in range(10)]
    assert [batch_warmup.sequences_before(plan, step) for step in range(11)] == list(np.cumsum([0, *sizes]))
    # Every third of the warmup's tokens is covered by its stage (the last step of a stage may run past it).
    for stage, bound in zip(plan[1:], (1024, 2048, 3072)):
        assert bound <= batch_warmup.sequences_before(plan, stage.first_step) * 32 < bound + 32 * 32

    big = override(warmup_config(), {"data.batch_size": 4608, "batch_warmup.start": 768, "batch_warmup.tokens": 10**8,
                                      "optimizer.grad_accum_steps": 48})
    plan = batch_warmup.stages(big)  # ModernBERT-base's 768 -> 4608, micro-batches of 96
    assert [s.batch_size for s in plan] == [768, 1536, 3072, 4608]
    assert all(s.batch_size // s.micro_batches <= 96 for s in plan) and plan[-1].micro_batches == 48


@pytest.mark.parametrize("key,value,message", [
    ("batch_warmup.start", 3, "config.batch_warmup.start=3: must divide config.data.batch_size=32"),
    ("batch_warmup.tokens", 0, "config.batch_warmup.tokens=0: must be positive"),
    ("batch_warmup.stages", 1, "config.batch_warmup.stages=1: must be at least 2"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(batch_warmup.BatchWarmupError, match=message):
        batch_warmup.validate(warmup_config(**{key: value}))


def test_resume_across_a_size_change_is_exact_with_four_compiled_steps(tmp_path, monkeypatch, one_device_mesh):
    config = warmup_config()
    programs = []
    build = train.build_program
    monkeypatch.setattr(train, "build_program", lambda *a: programs.append(build(*a)) or programs[-1])
    batches_fn = train.pretraining_data(config, 0, 1)  # the real pipeline, built once for the three runs
    straight = train.train_and_evaluate(config, str(tmp_path / "straight"), batches_fn)
    assert programs[0].step._cache_size() == 4  # one compiled step per batch size
    assert logged(tmp_path / "straight", "batch_size") == {s + 1: b for s, b in
                                                           enumerate([8, 8, 8, 8, 16, 16, 24, 24, 32, 32])}
    clock = train.token_clock(batch_warmup.stages(config), 32)
    schedule = train.optimizer_lib.learning_rate_schedule(config.optimizer, 10, clock)
    rates = logged(tmp_path / "straight", "learning_rate")
    np.testing.assert_allclose([rates[s + 1] for s in range(10)], [schedule(s) for s in range(10)], rtol=1e-6)
    # The warmup follows the tokens: its 6 steps see 4 x 8 + 2 x 16 sequences; after step 2 it has seen 16 of
    # them, after step 5 48 (by steps it would be at 2/6 and 5/6).
    peak = config.optimizer.learning_rate
    assert (rates[3], rates[6]) == (pytest.approx(0.25 * peak), pytest.approx(0.75 * peak))

    resumed_dir = str(tmp_path / "resumed")
    halfway = train.train_and_evaluate(config, resumed_dir, signalled_at(5, batches_fn))  # 1 step into size 16
    assert int(halfway["step"]) == 5
    resumed = train.train_and_evaluate(config, resumed_dir, batches_fn)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), straight, resumed)
    assert logged(tmp_path / "straight") == logged(resumed_dir)
