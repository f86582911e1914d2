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
