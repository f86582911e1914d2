"""A run over several processes (jax.distributed): how it starts, and how every process ends within seconds, with
one line each, when one of them fails.

- A process dies or freezes. JAX's coordination service (in process 0) stops hearing its heartbeats and, after
  config.distributed.peer_timeout_s, ends every other process (bert_jax.native_stderr turns the runtime's fatal
  record into one line). If process 0 dies, the others lose the service and end at once. A process sharing a
  collective with a dead peer usually learns first: the collective raises (Gloo: "Connection closed by peer"),
  and `failure_line` names that in one line.
- A process fails on its own: a UserError (a full disk, a corrupt shard only it reads), a bug, a peer lost in a
  collective, the step watchdog. `end_together` posts its line under one key of the coordination service's
  key-value store and exits; every other process waits on that key in a thread (`_watch`) and ends on it with one
  line naming the process. Process 0 runs the store, so before it exits it waits (at most ACK_SECONDS) until the
  others have seen the line.

These ways out skip jax.distributed's shutdown barrier, which waits for every process (shutdown_timeout_seconds)
and aborts when one of them is gone.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import NoReturn

from bert_jax import native_stderr

ERROR_KEY = "bert_jax/error"  # "process K: what went wrong", set once by the first process that fails
ENDED_KEY = "bert_jax/ended/"  # + process index: that process has seen the error and is ending
ACK_SECONDS = 5.0  # how long process 0 keeps the store up for the others to read the error
WATCH_MS = 600_000  # one long poll of the error key; repeated until the run ends
# Words of the runtime's errors when a collective lost a peer (Gloo on CPU, NCCL and the TPU runtime elsewhere).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Gloo", "NCCL", "DEADLINE_EXCEEDED",
             "UNAVAILABLE", "Socket closed")


class _Pod:
    """What this process knows of the run: its index, the distributed client, the last committed step."""

    def __init__(self, client, process: int, processes: int, peer_timeout_s: int):
        self.client, self.process, self.processes, self.peer_timeout_s = client, process, processes, peer_timeout_s
        self.committed: int | None = None
        self.step: int | None = None
        self.lost: set[int] = set()  # processes known gone: process 0 does not wait for them to see an error
        self.ending = threading.Lock()


_pod: _Pod | None = None


def start(coordinator_address: str | None, num_processes: int | None, process_id: int | None,
          peer_timeout_s: int) -> None:
    """jax.distributed.initialize with `peer_timeout_s` as the heartbeat timeout, then watch for other processes'
    errors."""
    global _pod
    import jax
    from jax._src import distributed  # the client: jax.distributed offers no public handle to its key-value store

    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               heartbeat_timeout_seconds=peer_timeout_s)
    _pod = _Pod(distributed.global_state.client, jax.process_index(), jax.process_count(), peer_timeout_s)
    tell()
    threading.Thread(target=_watch, name="bert_jax: errors of other processes", daemon=True).start()


def running() -> bool:
    return _pod is not None


def agree(what: str, timeout_s: float = 3600) -> None:
    """Wait until every process got here (a barrier of the coordination service, which a failed process never
    reaches: its error ends the waiting ones instead). No-op in a single process."""
    if _pod is not None:
        _pod.client.wait_at_barrier(f"bert_jax: {what}", int(timeout_s * 1000))


def note(step: int | None = None, committed: int | None = None) -> None:
    """The loop's progress, for the lines that end the run: the step it is in, the last committed checkpoint."""
    if _pod is None:
        return
    _pod.step = step if step is not None else _pod.step
    if committed is not None and committed != _pod.committed:
        _pod.committed = committed
        tell()


def tell() -> None:
    native_stderr.tell(process=_pod.process, committed=_pod.committed, peer_timeout_s=_pod.peer_timeout_s)


def failure_line(error: BaseException) -> str | None:
    """The one line for an error that says a collective lost a peer (None for any other error)."""
    text = f"{type(error).__name__}: {error}"
    if _pod is None or not any(word in text for word in PEER_LOST):
        return None
    others = [p for p in range(_pod.processes) if p != _pod.process]
    who = f"process {others[0]}" if len(others) == 1 else "another process"
    _pod.lost.update(others if len(others) == 1 else [])
    cause = " ".join(str(error).split())[:160]
    at = f" at step {_pod.step}" if _pod.step is not None else ""
    return (f"error: process {_pod.process} lost {who} in a collective{at} ({cause}); "
            f"{native_stderr.relaunch(_pod.committed)}")


def end_now(line: str) -> NoReturn:
    """Print `line` and end this process now, without its exit handlers (they could wait for the stuck work that
    made it end), and in a run over several processes the others too."""
    if _pod is not None:
        end_together(line)
    native_stderr.say_last(line)
    exit_now(1)


def end_together(line: str) -> NoReturn:
    """Print `line`, tell the other processes, and end this one (exit code 1) without the shutdown barrier."""
    pod = _pod
    pod.ending.acquire()  # one line per process: a second thread that wants to end waits here for the exit
    native_stderr.say_last(line)  # if the runtime ends this process while it tells the others: no second line
    message = line.removeprefix("error: ")
    for key, value in ((ERROR_KEY, f"process {pod.process}: {message}"), (f"{ENDED_KEY}{pod.process}", "")):
        try:
            pod.client.key_value_set(key, value)
        except Exception:  # noqa: BLE001 - another process set the error first, or the store is gone
            pass
    if pod.process == 0:
        wait_for_the_others(pod)
    exit_now(1)


def wait_for_the_others(pod: _Pod) -> None:
    """Until every other process has marked itself ending, or ACK_SECONDS passed (a dead one never will)."""
    deadline = time.monotonic() + ACK_SECONDS
    for other in sorted(set(range(1, pod.processes)) - pod.lost):
        left_ms = int(1000 * (deadline - time.monotonic()))
        if left_ms <= 0:
            return
        try:
            pod.client.blocking_key_value_get(f"{ENDED_KEY}{other}", left_ms)
        except Exception:  # noqa: BLE001 - not within the deadline
            return


def _watch() -> None:
    """Wait on the error key; when another process sets it, end this one with a line naming that process."""
    pod = _pod
    while True:
        try:
            posted = pod.client.blocking_key_value_get(ERROR_KEY, WATCH_MS)
        except Exception as error:  # noqa: BLE001 - the runtime's errors: a timeout, or the client shut down
            if "DEADLINE_EXCEEDED" in str(error):
                continue
            return
        if not posted.startswith(f"process {pod.process}:"):
            end_together(f"error: ended by {posted}")
        return


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, let native_stderr's child print what it holds, and leave without Python's teardown
    or exit handlers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe must not keep the process alive
            pass
    native_stderr.finish()
    os._exit(code)
