"""The run loop's way out: a stop waits for its checkpoint and, in a command, ends the process without waiting for
what the exit does not need; a failed asynchronous write stops the run after the step it failed in.

The loop runs a stand-in step (numpy, no compile) over a small state, so these tests are about the loop alone. Run as
a script, this file is the child process of the subprocess test: `python test_run_loop.py stopped-command DIR`.
"""
import asyncio
import atexit
import errno
import itertools
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bert_jax import checkpoints, run_loop

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
                                "checkpoint_every_secs": 0, "nan_policy": "stop", **overrides})


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
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(STOP_AT)]


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
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(STOP_AT)]


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
    {"stopped-command": stopped_command}[sys.argv[1]](sys.argv[2])
