"""How long a pretraining run takes to end after SIGTERM, on 1 and 2 processes, on a quiet and a loaded machine: a
preemption (a TPU VM's maintenance, a spot GPU) kills the process about 30 s after its notice.

    python benchmarks/signal_exit.py [--processes=1,2] [--load=0,4] [--repeats=1] [--repo=DIR]

Each run trains configs/bert.py:tiny on the bundled corpus (`python -m bert_jax.train`; 2 processes through
jax.distributed on localhost, gloo collectives), sends SIGTERM to every process once 5 steps are logged, and
timestamps from outside: the signal, the checkpoint's commit (its step folder appearing under checkpoints/, which
Orbax renames into place when the save is complete), the stop line, and each process's exit. --load=N runs N busy
processes beside it from its first logged step (after compiling) to its exit. --repo measures the code of another
checkout (e.g. an older commit) with this environment.
Prints a table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
STOP_LINE = "stopped by signal at step"
STEPS_BEFORE_SIGNAL = 5

PARSER = argparse.ArgumentParser(description=__doc__.split("\n")[0])
PARSER.add_argument("--processes", default="1,2", help="Process counts to measure, comma-separated.")
PARSER.add_argument("--load", default="0,4", help="Busy processes beside the run, comma-separated settings.")
PARSER.add_argument("--repeats", type=int, default=1, help="Runs per setting.")
PARSER.add_argument("--repo", default=str(REPO_ROOT), help="The checkout whose bert_jax runs (default: this one).")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_commands(workdir: pathlib.Path, processes: int) -> list[list[str]]:
    """One `bert_jax.train` command line per process: tiny BERT, a step logged each step, no scheduled save."""
    command = [sys.executable, "-m", "bert_jax.train", "--config=configs/bert.py:tiny", f"--workdir={workdir}",
               "--config.total_steps=100000", "--config.checkpoint_every_steps=100000", "--config.log_every_steps=1",
               "--config.eval_every_steps=0", "--config.peak_flops=1e12"]
    if processes == 1:
        return [command]
    port = free_port()
    return [[*command, f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
             f"--process_id={i}"] for i in range(processes)]


class Watched:
    """A child process whose output lines and exit are timestamped (time.monotonic) as they happen."""

    def __init__(self, command: list[str], cwd: str, env: dict):
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.lines: list[tuple[float, str]] = []
        self.exited_at: float | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))
        self.process.wait()
        self.exited_at = time.monotonic()

    def first(self, text: str) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.lines if text in line), None)

    def wait(self, timeout: float) -> None:
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.process.kill()
            self._reader.join()


def committed(checkpoints: pathlib.Path) -> bool:
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def logged_steps(metrics: pathlib.Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def one_run(processes: int, load: int, repo: str, cache: str) -> dict:
    """Start a run, load the machine once it steps, signal it after STEPS_BEFORE_SIGNAL logged steps, and time the
    way out (seconds)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache,
           "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    with tempfile.TemporaryDirectory(prefix="bert_jax-signal-exit-") as folder:
        workdir = pathlib.Path(folder) / "run"
        runs = [Watched(command, repo, env) for command in train_commands(workdir, processes)]
        wait_for_steps(runs, workdir / "metrics.jsonl", 1)
        with busy_beside(load):
            wait_for_steps(runs, workdir / "metrics.jsonl", STEPS_BEFORE_SIGNAL)
            signalled = time.monotonic()
            for r in runs:
                r.process.send_signal(signal.SIGTERM)
            commit = None
            while any(r.exited_at is None for r in runs) and time.monotonic() - signalled < 300:
                if commit is None and committed(workdir / "checkpoints"):
                    commit = time.monotonic()
                time.sleep(0.005)
            load_average = os.getloadavg()[0]
        for r in runs:
            r.wait(timeout=60)
    stop = runs[0].first(STOP_LINE)
    last_exit = max(r.exited_at for r in runs)
    relative = lambda t: None if t is None else round(t - signalled, 2)
    return dict(processes=processes, busy_processes=load, load_average=round(load_average, 1),
                exit_codes=[r.process.returncode for r in runs], stop_line=stop[1] if stop else None,
                signal_to_commit=relative(commit), signal_to_stop_line=relative(stop[0] if stop else None),
                signal_to_exit=[relative(r.exited_at) for r in runs],
                commit_to_exit=None if commit is None else round(last_exit - commit, 2),
                stop_line_to_exit=None if stop is None else round(last_exit - stop[0], 2))


def wait_for_steps(runs: list[Watched], metrics: pathlib.Path, steps: int) -> None:
    deadline = time.monotonic() + 900
    while logged_steps(metrics) < steps:
        if time.monotonic() > deadline or any(r.process.poll() is not None for r in runs):
            for r in runs:
                r.process.kill()
            raise RuntimeError("the run did not start:\n" + "\n".join(line for _, line in runs[0].lines[-20:]))
        time.sleep(0.05)


@contextlib.contextmanager
def busy_beside(count: int):
    """`count` busy processes beside the block (a loaded machine), killed when it ends."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in busy:
            p.kill()
            p.wait()


def main():
    flags = PARSER.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bert_jax-signal-exit-cache-") as cache:
        for load in map(int, flags.load.split(",")):
            for processes in map(int, flags.processes.split(",")):
                for _ in range(flags.repeats):
                    results.append(one_run(processes, load, flags.repo, cache))
                    print(json.dumps(results[-1]), file=sys.stderr)
    print(f"{'procs':>5}{'busy':>5}{'load':>6}{'signal->commit':>16}{'commit->exit':>14}{'stop line->exit':>17}"
          f"  exit codes")
    for r in results:
        print(f"{r['processes']:>5}{r['busy_processes']:>5}{r['load_average']:>6}{r['signal_to_commit']!s:>16}"
              f"{r['commit_to_exit']!s:>14}{r['stop_line_to_exit']!s:>17}  {r['exit_codes']}")
    worst = lambda key: max((r[key] for r in results if r[key] is not None), default=None)
    print(json.dumps({"runs": results, "worst_commit_to_exit": worst("commit_to_exit"),
                      "worst_stop_line_to_exit": worst("stop_line_to_exit")}))


if __name__ == "__main__":
    main()
