"""A run over 2 processes (jax.distributed on localhost, gloo) ends on every process, with one line each, whatever
stops one of them: a process killed, a process frozen (no heartbeats), an error only one process meets.

The processes run a stand-in command, this file run as a script (`python test_pod_faults.py PORT PROCESS FAULT`):
bert_jax.cli and bert_jax.pod around a loop of collectives, no model, so a case costs the start of two processes.
benchmarks/faults.py times the same faults on real training runs.
"""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from gcs_server import free_port

HERE = pathlib.Path(__file__).resolve()
PEER_TIMEOUT_S = 4
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}


def start_pair(fault: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, str(HERE), str(port), str(i), fault], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(2)]


def wait_for_steps(processes: list[subprocess.Popen], steps: int) -> None:
    """Until every process printed `steps` step lines."""
    for p in processes:
        for line in p.stdout:
            if line.strip() == f"step {steps}":
                break
        else:
            pytest.fail(f"a process ended before step {steps}: " + p.stderr.read()[-3000:])


def error_lines(p: subprocess.Popen) -> tuple[int, list[str]]:
    _, err = p.communicate(timeout=PEER_TIMEOUT_S + 60)
    return p.returncode, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("fault", ["kill -9 process 1", "kill -9 process 0", "freeze process 1",
                                   "an error on process 1"])
def test_every_process_ends_with_one_line(fault):
    processes = start_pair("error at step 5" if fault == "an error on process 1" else "none")
    wait_for_steps(processes, 3)
    victim = processes[int(fault[-1])]
    if fault.startswith("kill -9"):
        victim.kill()
    elif fault.startswith("freeze"):
        victim.send_signal(signal.SIGSTOP)
    survivors = [p for p in processes if p is not victim or fault.startswith("an error")]
    ended = {processes.index(p): error_lines(p) for p in survivors}
    if fault.startswith("freeze"):
        victim.send_signal(signal.SIGCONT)
        victim.kill()
        victim.communicate()

    for index, (code, lines) in ended.items():
        assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), (index, code, lines)
    line = {i: lines[0] for i, (_, lines) in ended.items()}
    if fault == "kill -9 process 1":
        assert line[0].startswith("error: process 0 lost process 1 in a collective at step ")
        assert line[0].endswith("the last committed checkpoint is step 2: rerun the same command (on every "
                                "process) to resume from it")
    elif fault == "kill -9 process 0":  # the collective or the lost coordination service, whichever came first
        assert "lost process 0 in a collective" in line[1] or "process 0 stopped answering" in line[1]
    elif fault == "freeze process 1":
        assert line[0] == (f"error: process 0: process 1 stopped answering (no heartbeat for "
                           f"config.distributed.peer_timeout_s={PEER_TIMEOUT_S} s); the last committed checkpoint is "
                           "step 2: rerun the same command (on every process) to resume from it")
    else:
        assert line == {1: "error: shard-00001.tfrecord: corrupt or truncated; prepare it again",
                        0: "error: ended by process 1: shard-00001.tfrecord: corrupt or truncated; prepare it again"}


@pytest.mark.parametrize("record, why", [
    (["F1205 04:44:08.989093    7115 client.h:80] Terminating process because the JAX distributed service detected "
      "fatal errors. ... absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task "
      "was preempted/died/restarted unexpectedly or this task is experiencing network issues.",
      "Additional GRPC error information from remote target coordination_service while calling /xla.coordination"
      ".CoordinationService/PollForError:", "*** Check failure stack trace: ***", "    @     0x7f027e440634  absl::"],
     "process 0 stopped answering (it runs the coordination service every process needs)"),
    (["F1205 04:07:07.636455   23729 client.h:80] Terminating process because the JAX distributed service detected "
      "fatal errors. ... absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
      "1", "The tasks have crashed."], "the other processes stopped waiting for this one (no heartbeat for "
                                       "config.distributed.peer_timeout_s=4 s)"),
    (["F0101 00:00:00.000000    1 cpu_client.cc:12] Check failed: buffer != nullptr. More text", "*** Check"],
     "it crashed: Check failed: buffer != nullptr"),
])
def test_the_runtimes_fatal_records_become_one_line(record, why):
    from bert_jax import native_stderr

    line = native_stderr.fatal_line(record, {"process": 1, "committed": 20, "peer_timeout_s": PEER_TIMEOUT_S})
    assert line == (f"error: process 1: {why}; the last committed checkpoint is step 20: rerun the same command (on "
                    "every process) to resume from it")


@pytest.mark.parametrize("closing_line", [None, "error: process 1 lost process 0 in a collective at step 4 (...)"])
def test_one_line_whether_the_runtime_aborts_before_or_after_the_commands_own(closing_line):
    """The child of native_stderr prints the command's closing line at once, and then no fatal line: the runtime
    may abort the process right after the command's line, or right before it (then only the fatal line)."""
    from bert_jax import native_stderr

    mark = native_stderr.STATUS_MARK
    fed = [f'{mark}{{"process": 1, "committed": 2}}']
    fed += [f'{mark}{{"ended": "{closing_line}"}}'] if closing_line else []
    fed += ["F1205 04:44:08.989093    7115 client.h:80] Terminating process because the JAX distributed service "
            "detected fatal errors. ... the leader task was preempted/died/restarted unexpectedly", "*** Check"]
    child = subprocess.run([sys.executable, "-m", "bert_jax.native_stderr"], input="\n".join(fed) + "\n",
                           capture_output=True, text=True, check=True)
    assert child.stdout.splitlines() == [closing_line or (
        "error: process 1: process 0 stopped answering (it runs the coordination service every process needs); the "
        "last committed checkpoint is step 2: rerun the same command (on every process) to resume from it")]


def stand_in_command(port: str, process_id: int, fault: str) -> None:
    """A command that syncs the two processes every step, as training does, and says which step it finished."""
    import numpy as np
    from jax.experimental import multihost_utils

    from bert_jax import cli, native_stderr, pod
    from bert_jax.errors import UserError

    def command(argv):  # as bert_jax.train.command starts a run
        native_stderr.start()
        pod.start(f"127.0.0.1:{port}", 2, process_id, PEER_TIMEOUT_S)
        for step in range(1, 10_000):
            pod.note(step=step, committed=2 if step > 2 else None)
            multihost_utils.process_allgather(np.array(step))
            if fault == "error at step 5" and process_id == 1 and step == 5:
                raise UserError("shard-00001.tfrecord: corrupt or truncated; prepare it again")
            print(f"step {step}", flush=True)
            time.sleep(0.1)

    sys.argv = sys.argv[:1]
    cli.run(command)


if __name__ == "__main__":
    stand_in_command(sys.argv[1], int(sys.argv[2]), sys.argv[3])
