"""Checkpoints that fail cleanly: an unreadable latest step falls back to an older one, a full disk is one SaveError,
kill -9 during a save leaves the previous step as the latest.

Run as a script, this file is the child process of the subprocess tests: `python test_checkpoint_faults.py CASE DIR`.
"""
import asyncio
import errno
import hashlib
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from bert_jax import checkpoints

HERE = pathlib.Path(__file__).resolve()
CHILD_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}


def state_at(step: int) -> dict:
    """A small trainer-like state whose values depend on the step (64 KiB of parameters: data files, not inline)."""
    rs = np.random.RandomState(step)
    return {"params": {"kernel": rs.standard_normal((128, 128)).astype(np.float32),
                       "bias": rs.standard_normal(128).astype(np.float32)},
            "opt_state": {"mu": rs.standard_normal(128).astype(np.float32)}, "step": np.int32(step)}


def abstract_state() -> dict:
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=one_device),
                        state_at(0))


def assert_state_is(state: dict, step: int) -> None:
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), y), state, state_at(step))


def saved_steps(workdir, *steps: int) -> pathlib.Path:
    """A workdir with a finished checkpoint of each step."""
    manager = checkpoints.checkpoint_manager(workdir, keep=5)
    for step in steps:
        checkpoints.save(manager, step, state_at(step))
    checkpoints.finish_saves(manager)
    return pathlib.Path(workdir) / checkpoints.CHECKPOINT_DIR


def fingerprint(folder: pathlib.Path) -> dict:
    """Every file under `folder` with its size and content hash."""
    return {str(p.relative_to(folder)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def biggest_file(folder: pathlib.Path) -> pathlib.Path:
    """The largest file of a step: the one holding the kernel's data."""
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def truncate(path: pathlib.Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def restore_latest(workdir):
    manager = checkpoints.checkpoint_manager(workdir, keep=5)
    try:
        return checkpoints.restore_latest(manager, abstract_state())
    finally:
        checkpoints.finish_saves(manager)


def skip_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "skipping" in r.getMessage()]


@pytest.mark.parametrize("damage, reason", [(truncate, "truncated"), (os.remove, "missing")])
def test_unreadable_latest_step_falls_back_and_is_kept_aside(tmp_path, caplog, damage, reason):
    folder = saved_steps(tmp_path, 1, 2)
    damage(biggest_file(folder / "2"))
    before = fingerprint(folder / "2")
    manager = checkpoints.checkpoint_manager(tmp_path, keep=5)

    step, state = checkpoints.restore_latest(manager, abstract_state())

    assert step == 1
    assert_state_is(state, 1)
    assert fingerprint(folder / "2.unreadable") == before  # moved aside whole, not changed
    [warning] = skip_warnings(caplog)
    assert "step 2" in warning and reason in warning and "2.unreadable" in warning and "\n" not in warning
    checkpoints.save(manager, 2, state_at(2))  # the step can be saved again
    checkpoints.finish_saves(manager)
    assert restore_latest(tmp_path)[0] == 2


def test_no_checkpoint_is_step_zero(tmp_path):
    assert restore_latest(tmp_path) == (0, None)


def test_no_readable_checkpoint_is_an_error_naming_the_steps(tmp_path, caplog):
    folder = saved_steps(tmp_path, 1, 2)
    for step in ("1", "2"):
        truncate(biggest_file(folder / step))
    before = fingerprint(folder)

    with pytest.raises(checkpoints.UnreadableCheckpointsError) as caught:
        restore_latest(tmp_path)

    message = str(caught.value)
    assert str(folder) in message and "1 (" in message and "2 (" in message and "--workdir" in message
    assert "\n" not in message and len(message) < 400
    assert fingerprint(folder) == before


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a disk that really fills up."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=False,
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: pathlib.Path, leave: int = 16 << 10) -> None:
    """Fill `disk` up to `leave` free bytes: room for a save to start (small metadata files), not for its arrays."""
    filler = disk / "filler"
    filler.unlink(missing_ok=True)
    stats = os.statvfs(disk)
    filler.write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - leave))


def first_save_error(check, timeout: float = 30.0) -> checkpoints.SaveError:
    """The SaveError `check` raises once the save in flight has failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            check()
        except checkpoints.SaveError as error:
            return error
        time.sleep(0.02)
    raise AssertionError("no SaveError")


def assert_no_space(error: checkpoints.SaveError, step: int) -> None:
    message = str(error)
    assert f"could not save step {step} " in message and "no space left on device" in message
    assert "the last good checkpoint is step 1" in message and "resume from step 1" in message
    assert "\n" not in message and len(message) < 300


def test_full_disk_is_one_save_error_and_keeps_the_last_good_step(small_disk):
    workdir = small_disk / "run"
    manager = checkpoints.checkpoint_manager(workdir, keep=5)
    checkpoints.save(manager, 1, state_at(1))
    checkpoints.wait_for_save(manager)
    fill(small_disk)

    checkpoints.save(manager, 2, state_at(2))  # starts; its writes fail in the background
    assert_no_space(first_save_error(lambda: checkpoints.check_saves(manager)), 2)

    fill(small_disk)  # the failed save's partial files took some of what was left
    checkpoints.save(manager, 3, state_at(3))
    with pytest.raises(checkpoints.SaveError) as caught:
        checkpoints.save(manager, 4, state_at(4))  # the next save reports the failed one
    assert_no_space(caught.value, 3)

    fill(small_disk)
    checkpoints.save(manager, 5, state_at(5))
    with pytest.raises(checkpoints.SaveError) as caught:
        checkpoints.finish_saves(manager)
    assert_no_space(caught.value, 5)

    (small_disk / "filler").unlink()
    step, state = restore_latest(workdir)
    assert step == 1
    assert_state_is(state, 1)


def test_a_failed_save_leaves_no_error_pending_for_the_next_save_or_close():
    """Orbax's finalize thread raises a save's first error and leaves the checkpointer's metadata write unawaited; on
    a full disk that write fails too (seen in CI), and its error ended the next save. wait_for_save awaits it."""
    class Checkpointer:
        pending = [OSError(errno.ENOSPC, "metadata"), OSError(errno.ENOSPC, "metadata")]

        def wait_until_finished(self):
            if self.pending:
                raise self.pending.pop(0)

    class Manager:
        directory, _checkpointer = "/bucket/run/checkpoints", Checkpointer()

        def latest_step(self):
            return 2

        def wait_until_finished(self):
            raise OSError(errno.ENOSPC, "arrays")

    manager = Manager()
    with pytest.raises(checkpoints.SaveError, match="could not save step 2 .*no space left on device"):
        checkpoints.wait_for_save(manager)
    assert manager._checkpointer.pending == []


def test_failed_save_at_exit_prints_one_short_error(small_disk):
    child = subprocess.run([sys.executable, str(HERE), "fail-at-exit", str(small_disk)], env=CHILD_ENV,
                           check=False, capture_output=True, text=True, timeout=120)
    lines = child.stderr.strip().splitlines()
    assert child.returncode == 1, child.stderr[-3000:]
    assert lines[-1].startswith("error: could not save step 2 ") and "no space left on device" in lines[-1]
    assert len(lines) < 20, child.stderr[-3000:]
    assert "sys.meta_path is None" not in child.stderr and "Traceback" not in child.stderr


def test_asyncio_reports_of_failed_orbax_writes_are_left_out():
    """asyncio logs each unawaited write task's error again ("Task exception was never retrieved")."""
    def record_of_error_raised_in(filename: str) -> logging.LogRecord:
        try:
            exec(compile("raise ValueError('RESOURCE_EXHAUSTED: No space left on device')", filename, "exec"))
        except ValueError:
            return logging.LogRecord("asyncio", logging.ERROR, asyncio.base_events.__file__, 1,
                                     "Task exception was never retrieved", None, sys.exc_info())

    checkpoints.quiet_reported_orbax_errors()
    asyncio_logger = logging.getLogger("asyncio")
    assert not asyncio_logger.filter(record_of_error_raised_in(f"{os.sep}site-packages{os.sep}orbax{os.sep}w.py"))
    assert asyncio_logger.filter(record_of_error_raised_in(f"{os.sep}elsewhere{os.sep}user_code.py"))


def test_thread_errors_inside_orbax_are_left_out(monkeypatch):
    """A save thread that ends in Orbax's error is not reported (no traceback); any other thread's error is."""
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_traceback.tb_frame.f_code))

    def thread_raising_in(filename: str) -> None:
        code = compile("raise OSError('No space left on device')", filename, "exec")
        thread = threading.Thread(target=exec, args=(code, {}))
        thread.start()
        thread.join()

    checkpoints.quiet_reported_orbax_errors()
    thread_raising_in(f"{os.sep}site-packages{os.sep}orbax{os.sep}w.py")
    assert reported == []
    thread_raising_in(f"{os.sep}elsewhere{os.sep}user_code.py")
    assert len(reported) == 1


def test_kill_during_save_keeps_the_previous_step(tmp_path):
    child = subprocess.Popen([sys.executable, str(HERE), "pause-before-commit", str(tmp_path)], env=CHILD_ENV,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "committing step 2", "the child did not reach the commit"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    folder = tmp_path / checkpoints.CHECKPOINT_DIR
    assert any(p.name.startswith("2.") for p in folder.iterdir())  # step 2 was written but not committed

    step, state = restore_latest(tmp_path)

    assert step == 1
    assert_state_is(state, 1)


def fail_at_exit(disk: str) -> None:
    """A command whose last save fails on a full disk, run the way every bert_jax command runs."""
    from bert_jax import cli

    def command(argv):
        manager = checkpoints.checkpoint_manager(os.path.join(disk, "run"), keep=5)
        try:
            checkpoints.save(manager, 1, state_at(1))
            checkpoints.wait_for_save(manager)
            fill(pathlib.Path(disk))
            checkpoints.save(manager, 2, state_at(2))
        finally:
            checkpoints.finish_saves(manager)

    sys.argv = sys.argv[:1]
    cli.run(command)


def pause_before_commit(workdir: str) -> None:
    """Save step 1, then step 2 up to the moment Orbax renames its folder into place, and wait there to be killed."""
    from orbax.checkpoint._src.path import atomicity

    async def paused(*args, **kwargs):
        print("committing step 2", flush=True)
        await asyncio.sleep(600)

    manager = checkpoints.checkpoint_manager(workdir, keep=5)
    checkpoints.save(manager, 1, state_at(1))
    checkpoints.wait_for_save(manager)
    atomicity.on_commit_callback = paused
    checkpoints.save(manager, 2, state_at(2))
    checkpoints.finish_saves(manager)


if __name__ == "__main__":
    {"fail-at-exit": fail_at_exit, "pause-before-commit": pause_before_commit}[sys.argv[1]](sys.argv[2])
