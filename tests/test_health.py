"""bert_jax.health on its own: which steps are unhealthy, when a checkpoint becomes good, how skips are bounded and
what a restart keeps. tests/test_run_loop.py and tests/test_train_resume.py run it inside the loop."""
import numpy as np
import pytest

from bert_jax import health
from bert_jax.health import Health, Policy

STEADY = [{"loss": 2.0 + 0.01 * (i % 5), "grad_norm": 1.0 + 0.02 * (i % 3), "finite": True} for i in range(40)]


def judged(policy: Policy = Policy(), steps: list[dict] = STEADY, start: int = 0, record: dict | None = None):
    judge = Health(policy, record or {}, start, [])
    return judge, judge.review(start, steps)


def test_a_spike_of_the_loss_or_gradient_norm_stops_the_run_under_either_policy():
    for nan_policy in ("stop", "skip"):
        for key in ("loss", "grad_norm"):
            _, (problems, stop) = judged(Policy(nan_policy), [*STEADY, {**STEADY[0], key: 50.0}])
            name = "loss" if key == "loss" else "gradient norm"
            assert stop.step == 41 and stop.problem.startswith(f"the {name} spiked to 50, above ")
            assert stop.problem.endswith("(the mean + 6 sigma of the last 40 healthy steps)")
            assert problems[:40] == [""] * 40


def test_no_spike_test_without_enough_healthy_steps_or_with_spike_sigmas_0():
    few = STEADY[:health.SPIKE_MIN_STEPS - 1]
    assert judged(steps=[*few, {**few[0], "loss": 1e6}])[1][1] is None
    assert judged(Policy(spike_sigmas=0), [*STEADY, {**STEADY[0], "loss": 1e6}])[1][1] is None


def test_a_checkpoint_is_good_once_the_step_after_it_was_healthy():
    judge = Health(Policy(), {}, 0, [])
    judge.review(0, STEADY[:10])
    judge.saved(10)
    assert judge.newest_good() is None  # step 11 has not run
    judge.review(10, STEADY[10:11])
    judge.saved(12)
    assert judge.newest_good() == 10 and judge.protected() == {10}
    judge.review(12, STEADY[12:13])
    judge.saved(13)
    problems, stop = judge.review(13, [{**STEADY[13], "loss": np.nan}])
    assert stop.step == 14 and stop.problem == "the loss is nan" and problems == ["the loss is nan"]
    assert judge.newest_good() == 12 and judge.pending == 13  # step 14's NaN judges the parameters saved at 13


def test_skips_are_bounded_and_pin_the_good_checkpoint_from_before_the_first():
    judge = Health(Policy("skip", max_consecutive_skips=3), {}, 0, [])
    judge.review(0, STEADY[:20])
    judge.saved(20)
    judge.review(20, STEADY[20:22])  # 20 is good
    judge.saved(22)
    nan = {"loss": np.nan, "grad_norm": np.nan, "finite": False}
    problems, stop = judge.review(22, [nan, nan, STEADY[0], nan, nan, nan])
    assert stop is None and problems == ["the loss is nan", "the loss is nan", "", *["the loss is nan"] * 3]
    assert judge.pinned == 20 and judge.protected() == {20}  # 22 was judged by the skipped step 23
    problems, stop = judge.review(28, [nan])
    assert stop.step == 29 and stop.problem == ("the loss is nan, the 4th skipped update in a row "
                                               "(config.max_consecutive_skips=3)")


def test_a_restart_keeps_the_window_and_the_good_checkpoints():
    judge, _ = judged(steps=STEADY)
    judge.saved(40)
    judge.review(40, STEADY[:1])
    record = judge.record(steps_on_disk=[40])
    again = Health(Policy(), record, 41, [40, 41])
    assert again.newest_good() == 40 and again.pending == 41
    assert list(again.window["loss"]) == list(judge.window["loss"])
    assert again.review(41, [{**STEADY[0], "loss": 50.0}])[1].step == 42  # the spike test needs no warm-up again


def test_checkpoints_from_before_the_record_count_as_good_but_not_the_resumed_one():
    judge = Health(Policy(), {}, 30, [10, 20, 30])
    assert judge.newest_good() == 20 and judge.pending == 30


@pytest.mark.parametrize("good, moved, ending", [
    (20, ["21.diverged"], "the last good checkpoint is step 20 (21.diverged moved aside, their files kept). Lower "),
    (None, [], "no good checkpoint exists. Lower "),
])
def test_the_stop_line_names_the_checkpoint_to_resume_from(good, moved, ending):
    line = health.stop_line(health.Diverged(22, "the loss is nan"), good, moved)
    assert line.startswith(f"step 22: the loss is nan; stopped, {ending}")
    assert line.endswith(f"then rerun the same command to {'resume from step 20' if good else 'start from step 0'}")
