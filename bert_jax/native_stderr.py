"""What the C++ libraries under a training command (XLA, gRPC, Gloo, TensorFlow) write to stderr, as one line.

Python's output goes to sys.stderr; native code writes to file descriptor 2 directly, and when the JAX runtime ends
a process (the coordination service saw a peer stop sending heartbeats, or lost process 0 that runs it) it prints a
fatal log record, a status several lines long and a C++ stack trace, then aborts. No Python code runs on that path:
jaxlib 0.10.2 takes a `missed_heartbeat_callback` but cannot pass the absl::Status it calls it with to a Python
function (nanobind raises std::bad_cast and the process terminates), and jax.distributed.initialize does not pass
one. So a training command without --verbosity points descriptor 2 at a small child process (this module run as a
program) and gives Python's sys.stderr a copy of the original: the child drops the native lines and, when the
process dies after a fatal record, prints one `error:` line in its place, naming the process that stopped answering
and the last committed checkpoint, which the command keeps it told of (`tell`).
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import re
import subprocess
import sys

STATUS_MARK = "\x1ebert_jax-status "  # a line the command writes to the child: JSON of what a fatal line names
FATAL = re.compile(r"^F\d{4} \S+\s+\d+ \S+:\d+\] (.*)")  # absl's fatal record: F1205 03:44:08.98 7115 client.h:80]
CRASH = re.compile(r"^(Fatal Python error: .*)")  # what faulthandler writes for a segfault or an abort
FINISH_WAIT_S = 1.0  # how long an ending process waits for the child to print its line
_child: subprocess.Popen | None = None


def start() -> None:
    """Route this process's native stderr through the child; Python's output keeps the original stderr."""
    global _child
    if _child is not None:
        return
    sys.stderr.flush()
    original = os.dup(2)
    # Its own session: a Ctrl-C or a signal to the job's process group must not end it before the command.
    child = subprocess.Popen([sys.executable, "-m", "bert_jax.native_stderr"], stdin=subprocess.PIPE,
                             stdout=original, stderr=subprocess.DEVNULL, start_new_session=True)
    os.dup2(child.stdin.fileno(), 2)
    child.stdin.close()  # descriptor 2 now holds the only write end: the child sees EOF when this process ends
    if faulthandler.is_enabled():  # absl enables it: Python's stacks of an abort are native output too
        faulthandler.enable(file=sys.__stderr__)
    python_stderr = io.TextIOWrapper(os.fdopen(original, "wb", buffering=0), encoding="utf-8",
                                     errors="backslashreplace", line_buffering=True, write_through=True)
    swap_python_stderr(python_stderr)
    _child = child


def swap_python_stderr(stream) -> None:
    """sys.stderr, and the handlers that kept the old one (absl's), write to `stream` from now on."""
    import logging

    from absl import logging as absl_logging

    old = sys.stderr
    sys.stderr = stream
    handlers = [absl_logging.get_absl_handler().python_handler, *logging.getLogger().handlers]
    for handler in handlers:
        if getattr(handler, "stream", None) is old:
            handler.stream = stream


def tell(**status) -> None:
    """What the child's line names if the runtime ends this process: process, committed, peer_timeout_s."""
    if _child is not None:
        os.write(2, (STATUS_MARK + json.dumps(status) + "\n").encode())


def say_last(line: str) -> None:
    """Print the process's closing line. Through the child when it runs, in the same write that tells it the process
    has its line: the runtime may abort the process at any moment now (its peer is gone), and a line printed here
    and then announced, or announced and then printed, could come out twice or not at all."""
    bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
    on_a_bar = bool(bars and getattr(bars, "_instances", None))  # a progress bar's line ends without a newline
    if _child is not None:
        os.write(2, (STATUS_MARK + json.dumps({"ended": "\n" * on_a_bar + line}) + "\n").encode())
    else:
        sys.stderr.write("\n" * on_a_bar + line + "\n")
        sys.stderr.flush()


def finish() -> None:
    """Before the process exits: end the child's input and let it print what it holds, so that the closing line
    comes out before the process has ended (before the shell's prompt, not after it)."""
    if _child is None:
        return
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the last write end of the child's input, unless a subprocess
    with contextlib.suppress(subprocess.TimeoutExpired):  # of this one holds another: then the child prints later
        _child.wait(timeout=FINISH_WAIT_S)


def fatal_line(record: list[str], status: dict) -> str:
    """The one line for a process the JAX runtime ended: `record`, the fatal log record and what followed it."""
    text = "\n".join(record)
    me = status.get("process", 0)
    lost = lost_processes(text)
    timeout = status.get("peer_timeout_s")
    silence = f" (no heartbeat for config.distributed.peer_timeout_s={timeout} s)" if timeout else ""
    if lost is not None and me in lost:  # a frozen process that woke up, or one cut off from process 0
        why = f"the other processes stopped waiting for this one{silence}"
    elif lost is not None:
        why = f"process {', '.join(map(str, lost))} stopped answering{silence}"
    elif "coordination service" in text or "leader task" in text:
        why = "process 0 stopped answering (it runs the coordination service every process needs)"
    else:
        first = (FATAL.match(record[0]) or CRASH.match(record[0])).group(1)
        why = f"it crashed: {first.split('. ')[0][:200]}"
    return f"error: process {me}: {why}; {relaunch(status.get('committed'))}"


def lost_processes(text: str) -> list[int] | None:
    """The processes the coordination service found without heartbeats, from its status text (None: not that)."""
    found = re.search(r"stopped sending heartbeats\):?\s*\n((?:\s*(?:/job:\S*task:)?\d+\s*\n)+)", text + "\n")
    if not found:
        return None
    return [int(task) for task in re.findall(r"(\d+)\s*$", found.group(1), re.M)]


def relaunch(committed: int | None) -> str:
    """How to go on, for the lines that end a run from outside its loop (a lost process, the watchdog)."""
    if committed is None:
        return "no checkpoint was committed, so rerunning the same command (on every process) starts afresh"
    return (f"the last committed checkpoint is step {committed}: rerun the same command (on every process) to "
            "resume from it")


def main() -> None:
    """The child: keep the latest status, collect a fatal record, and at EOF print its one line (if any)."""
    status, record = {}, []
    for raw in sys.stdin.buffer:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line.startswith(STATUS_MARK):
            status.update(json.loads(line[len(STATUS_MARK):]))
            if "ended" in status and status["ended"] is not True:
                sys.stdout.write(status["ended"] + "\n")
                sys.stdout.flush()
                status["ended"] = True
        elif record or FATAL.match(line) or CRASH.match(line):
            record.append(line)
    if record and not status.get("ended"):
        bar_above = status.get("process", 0) == 0  # process 0's progress bar ends its last line without a newline
        sys.stdout.write("\n" * bar_above + fatal_line(record, status) + "\n")


if __name__ == "__main__":
    main()
