"""The run loop's way out: a stop waits for its checkpoint and, in a command, ends the process without waiting for
what the exit does not need; a failed asynchronous write stops the run after the step it failed in.

The loop runs a stand-in step (numpy, no compile) over a small state, so these tests are about the loop alone. Run as
a script, this file is the child process of the subprocess test: `python test_run_loop.py stopped-command DIR`.
"""
import asyncio
import atexit
import errno
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bert_jax import checkpoints, health, run_loop

HERE = pathlib.Path(__file__).resolve()
STOP_AT = 3


def state_at(step: int) -> dict:
    rs = np.random.RandomState(step)
    return {"params": {"kernel": rs.standard_normal((64, 64)).astype(np.float32)}, "step": np.int32(step)}


def stand_in_step(state, batch):
    """One 'update': the state of the next step, and the metrics a real step reports."""
    step = int(state["step"]) + 1
    return state_at(step), {"loss": np.float32(1.0 / step), "finite": np.bool_(True)}


def schedule(**overrides) -> run_loop.Schedule:
    return run_loop.Schedule(**{"total_steps": 20, "log_every_steps": 1, "checkpoint_every_steps": 1000,
                                "checkpoint_every_secs": 0, **overrides})


def signalled_batches():
    """Batches that send this process SIGTERM while the batch of step STOP_AT is fetched."""
    for step in itertools.count(1):
        if step == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        yield {}


def test_a_stop_waits_for_its_checkpoint_and_says_how_long_it_took(tmp_path, capsys):
    manager = checkpoints.checkpoint_manager(tmp_path, keep=2)
    outcome = run_loop.run(state_at(0), 0, signalled_batches(), stand_in_step, schedule(), tmp_path, manager)
    assert outcome.stopped and int(outcome.state["step"]) == STOP_AT
    lines = [line for line in capsys.readouterr().out.splitlines() if "stopped by signal" in line]
    assert len(lines) == 1 and lines[0].startswith(f"stopped by signal at step {STOP_AT}; checkpoint saved in ")
    assert lines[0].endswith(" s, rerun the same command to continue")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(STOP_AT), "health.json"]


def test_a_failed_write_stops_the_run_after_the_step_it_failed_in(tmp_path, monkeypatch):
    """The write of step 2 fails while step FAILS_IN runs (Orbax's commit raises the disk's error then); the step
    waits until Orbax has given up on the save, so the loop's check after it must stop the run."""
    from orbax.checkpoint._src.path import atomicity

    FAILS_IN = 3  # after the save of step 2, before the save of step 4 (which would wait for it)
    fail_now, steps_run = threading.Event(), []

    async def commit_fails_on_request(*args, **kwargs):
        await asyncio.to_thread(fail_now.wait, 120)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomicity, "on_commit_callback", commit_fails_on_request)
    manager = checkpoints.checkpoint_manager(tmp_path, keep=2)

    def step(state, batch):
        steps_run.append(int(state["step"]) + 1)
        if steps_run[-1] == FAILS_IN:
            fail_now.set()
            deadline = time.monotonic() + 120
            while manager.is_saving_in_progress() and time.monotonic() < deadline:
                time.sleep(0.01)
        return stand_in_step(state, batch)

    with pytest.raises(checkpoints.SaveError, match="could not save step 2 .*: no space left on device; no "
                                                    "checkpoint was saved before it"):
        run_loop.run(state_at(0), 0, itertools.repeat({}), step, schedule(checkpoint_every_steps=2), tmp_path,
                     manager)
    assert steps_run == list(range(1, FAILS_IN + 1))


def spiking_step(spike_at: int):
    """The stand-in step, whose loss jumps to 1e6 at step `spike_at` (its parameters had diverged)."""
    def step(state, batch):
        state, metrics = stand_in_step(state, batch)
        return state, {**metrics, "loss": np.float32(1e6 if int(state["step"]) == spike_at else metrics["loss"])}
    return step


def test_a_spike_moves_the_checkpoints_not_shown_good_aside_and_the_rerun_resumes_from_the_good_one(tmp_path):
    """A checkpoint every step, keep_checkpoints=1: the spike at step 25 judges the parameters saved at 24, so 24 is
    moved aside and 23 (shown good by step 24, kept though keep is 1) is where the rerun starts."""
    manager = checkpoints.checkpoint_manager(tmp_path, keep=1)
    with pytest.raises(health.DivergenceError, match=re.escape("step 25: the loss spiked to 1e+06, above ") + ".* "
                       + re.escape("(the mean + 6 sigma of the last 24 healthy steps); stopped, the last good "
                                   "checkpoint is step 23 (24.diverged moved aside, their files kept).")):
        run_loop.run(state_at(0), 0, itertools.repeat({}), spiking_step(25),
                     schedule(total_steps=30, checkpoint_every_steps=1), tmp_path, manager)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["23", "24.diverged", "health.json"]
    manager = checkpoints.checkpoint_manager(tmp_path, keep=1)
    assert manager.latest_step() == 23 and checkpoints.read_health(manager)["good"] == [23]
    outcome = run_loop.run(state_at(23), 23, itertools.repeat({}), stand_in_step, schedule(total_steps=26),
                           tmp_path, manager)
    assert int(outcome.state["step"]) == 26 and manager.all_steps() == [26]


def test_scheduled_values_are_logged_as_the_last_steps_and_measured_ones_as_means(tmp_path):
    def step(state, batch):
        state, metrics = stand_in_step(state, batch)
        return state, {**metrics, "batch_size": np.float32(int(state["step"])), "loss": np.float32(state["step"])}

    manager = checkpoints.checkpoint_manager(tmp_path, keep=1)
    run_loop.run(state_at(0), 0, itertools.repeat({}), step, schedule(total_steps=10, log_every_steps=5), tmp_path,
                 manager)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["batch_size"], r["loss"]) for r in rows] == [(5, 5.0, 3.0), (10, 10.0, 8.0)]


def test_a_step_that_hangs_ends_the_command_with_one_line_naming_it(tmp_path):
    """The watchdog (1 s here): the first step, which compiles in a real run, may take longer; step 3 hangs in its
    input and ends the process, which a non-daemon thread would otherwise hold forever."""
    child = subprocess.run([sys.executable, str(HERE), "hung-command", str(tmp_path)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    lines = [line for line in child.stderr.splitlines() if line.strip() and "%|" not in line]
    assert child.returncode == 1 and lines == [
        "error: step 3 did not finish within config.watchdog_s=1 s (a stalled input, device or process); the last "
        "committed checkpoint is step 2: rerun the same command (on every process) to resume from it"], child.stderr


def hung_command(workdir: str) -> None:
    from bert_jax import cli, native_stderr

    never = threading.Event()
    threading.Thread(target=never.wait, name="left behind").start()

    def batches_that_hang():
        for step in itertools.count(1):
            if step == 3:
                never.wait()
            yield {}

    def slow_first_step(state, batch):
        if int(state["step"]) == 0:
            time.sleep(2)
        return stand_in_step(state, batch)

    def command(argv):  # as a training command runs: its native stderr reduced to a fatal error's line
        native_stderr.start()
        manager = checkpoints.checkpoint_manager(workdir, keep=2)
        run_loop.run(state_at(0), 0, batches_that_hang(), slow_first_step,
                     schedule(watchdog_s=1, checkpoint_every_steps=2), workdir, manager)

    sys.argv = sys.argv[:1]
    cli.run(command)


def test_a_stopped_command_exits_without_waiting_for_what_it_leaves_behind(tmp_path):
    """In a command, nothing after the stop line may wait: here a non-daemon thread that never ends and a batch
    iterator whose clean-up blocks (as freeing tf.data's iterator waits for the batches in flight). Either would
    hold the process forever if the loop returned into Python's usual exit."""
    child = subprocess.run([sys.executable, str(HERE), "stopped-command", str(tmp_path)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert child.returncode == 0, child.stderr[-3000:]
    assert f"stopped by signal at step {STOP_AT}; checkpoint saved in " in child.stdout
    assert "atexit handler ran" in child.stdout  # what a normal exit runs (jax.distributed's shutdown) still runs
    assert "returned from run" not in child.stdout
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(STOP_AT), "health.json"]


def stopped_command(workdir: str) -> None:
    from bert_jax import cli

    never = threading.Event()
    threading.Thread(target=never.wait, name="left behind").start()
    atexit.register(print, "atexit handler ran")

    def batches_whose_clean_up_blocks():
        try:
            yield from signalled_batches()
        finally:
            never.wait()

    def command(argv):
        manager = checkpoints.checkpoint_manager(workdir, keep=2)
        run_loop.run(state_at(0), 0, batches_whose_clean_up_blocks(), stand_in_step, schedule(), workdir, manager)
        print("returned from run")

    sys.argv = sys.argv[:1]
    cli.run(command)


if __name__ == "__main__":
    {"stopped-command": stopped_command, "hung-command": hung_command}[sys.argv[1]](sys.argv[2])
