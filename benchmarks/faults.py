"""The faults a pod meets, each on 1 and 2 processes on localhost: how long every process takes to end after the
fault, with which exit codes and how many stderr lines, and whether the relaunch resumes bit-exact.

    python benchmarks/faults.py [--faults=NAME,...] [--processes=1,2] [--load=0] [--repo=DIR]

Every run trains configs/bert.py:tiny on the bundled corpus, prepared once into shards (`python -m bert_jax.train`;
2 processes through jax.distributed on localhost, gloo collectives), 40 steps logged each step, a checkpoint every 10.
The faults (--faults, default all):

  kill_1, kill_0   kill -9 of process 1 (2 processes) or process 0, after 15 logged steps
  freeze_1         SIGSTOP of process 1 (2 processes): detected by the heartbeat timeout (peer_timeout_s=20 here)
  hang             the input of the last process stalls at step 15 while the process lives (watchdog_s=30 here)
  disk_full        the workdir's tmpfs is filled after 15 steps: process 0's metrics write fails (needs root)
  corrupt_shard    a prepared shard that only the last process reads is truncated before the start; then the
                   prepare command is rerun as the error says
  diverge_stop     stopped at step 20, resumed at learning rate 1e6 with a checkpoint every step, nan_policy=stop;
                   then the relaunch at the original rate
  diverge_skip     the same at 1e30 (NaN at once) with nan_policy=skip
  flaky_bucket     the workdir and the shards in a GCS server on localhost behind a proxy that fails 2% of the
                   requests (429, 503, reset) (tests/gcs_server.py)
  outage           the same proxy failing every request from step 15 on (watchdog_s=300, so that the failed
                   request, not the watchdog, ends the run)
  long_compile     not a fault: BERT-base's first compile on 2 processes with a 3 s peer timeout and both cores
                   busy, to see whether the heartbeats go on while XLA compiles (what the default timeout rests on)

The seconds run from the fault (the signal, the disk filled, the outage begun; for a fault the run itself finds, its
first error line) to each process's exit. After a fault that ends a run, the same command is run again to step 40;
its losses are compared with an uninterrupted run's, bit for bit. --load=N runs N busy processes beside each run.
Prints a table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from signal_exit import REPO_ROOT, busy_beside, free_port

sys.path.insert(0, str(REPO_ROOT / "tests"))
from gcs_server import FlakyProxy, GcsServer  # noqa: E402 - the tests' GCS server and its fault-injecting proxy

STEPS, FAULT_AT = 40, 15
PEER_TIMEOUT_S, WATCHDOG_S = 20, 30
TRAIN = ["--config=configs/bert.py:tiny", "--config.data.seq_length=32", "--config.data.batch_size=8",
         "--config.masking.max_predictions_per_seq=5", "--config.log_every_steps=1", "--config.eval_every_steps=0",
         "--config.peak_flops=1e9", "--config.optimizer.warmup_steps=1", "--config.checkpoint_every_steps=10",
         f"--config.distributed.peer_timeout_s={PEER_TIMEOUT_S}", f"--config.watchdog_s={WATCHDOG_S}"]
FAULTS = ("kill_1", "kill_0", "freeze_1", "hang", "disk_full", "corrupt_shard", "diverge_stop", "diverge_skip",
          "flaky_bucket", "outage", "long_compile")

PARSER = argparse.ArgumentParser(description=__doc__.split("\n")[0])
PARSER.add_argument("--faults", default=",".join(FAULTS), help="Faults to run, comma-separated.")
PARSER.add_argument("--processes", default="1,2", help="Process counts, comma-separated.")
PARSER.add_argument("--load", type=int, default=0, help="Busy processes beside each run.")
PARSER.add_argument("--repo", default=str(REPO_ROOT), help="The checkout whose bert_jax runs (default: this one).")
PARSER.add_argument("--hang_at", type=int, default=0, help=argparse.SUPPRESS)  # the stalled child (hang)


class Process:
    """One training process whose stdout and stderr lines (each part of a \\r-redrawn line apart) and exit are
    timestamped as they happen."""

    def __init__(self, command: list[str], cwd: str, env: dict):
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self.exited_at: float | None = None
        self._readers = [threading.Thread(target=self._read, args=(s, lines), daemon=True)
                         for s, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _read(self, stream, lines):
        for raw in stream:
            for part in raw.decode("utf-8", "replace").replace("\r", "\n").splitlines():
                lines.append((time.monotonic(), part.rstrip()))

    def _wait(self):
        self.process.wait()
        self.exited_at = time.monotonic()

    def error_lines(self) -> list[str]:
        """stderr without the progress bar."""
        return [line for _, line in self.err if line.strip() and "%|" not in line]

    def first_error_at(self) -> float | None:
        return next((t for t, line in self.err if line.startswith("error:")), None)

    def finish(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.exited_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.exited_at is None:
            self.process.kill()
            self.process.wait()
            self.exited_at = time.monotonic()
        for reader in self._readers:
            reader.join(5)


class Runs:
    """Starts runs of bert_jax.train on 1 or 2 processes and compares their losses."""

    def __init__(self, repo: str, folder: pathlib.Path, env: dict):
        self.repo, self.folder, self.env = repo, folder, env

    def start(self, workdir, processes: int, *flags: str, env: dict | None = None,
              hang_at: int = 0) -> list[Process]:
        """The processes of one run; `hang_at`: the last process's input stalls at that step."""
        program = ([sys.executable, __file__, f"--hang_at={hang_at}", "--"] if hang_at
                   else [sys.executable, "-m", "bert_jax.train"])
        config = [f for f in flags if f.startswith("--config=")] or TRAIN[:1]  # before the overrides of its keys
        command = [*program, f"--workdir={workdir}", *config, *TRAIN[1:], *(f for f in flags if f not in config)]
        port = free_port()
        commands = [command] if processes == 1 else [
            [*command, f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
             f"--process_id={i}"] for i in range(processes)]
        return [Process(c, self.repo, {**self.env, **(env or {})}) for c in commands]

    def complete(self, workdir, processes: int, *flags: str, env: dict | None = None) -> list[Process]:
        run = self.start(workdir, processes, *flags, env=env)
        for p in run:
            p.finish()
        return run


def logged_losses(workdir) -> dict[int, float]:
    from bert_jax import storage

    path = storage.as_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def wait_for_steps(run: list[Process], workdir, steps: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while len(logged_losses(workdir)) < steps:
        if time.monotonic() > deadline or any(p.exited_at is not None for p in run):
            for p in run:
                p.process.kill()
            raise RuntimeError("the run did not get going:\n" + "\n".join(line for _, line in run[0].err[-15:]))
        time.sleep(0.2)


def resumed_step(run: list[Process]) -> int | None:
    for _, line in run[0].out + run[0].err:
        if "resuming from" in line and " at step " in line:
            return int(line.rsplit(" at step ", 1)[1].split()[0])
    return None


def outcome(fault: str, processes: int, run: list[Process], fault_at: float | None, **extra) -> dict:
    """What the JSON line holds of one fault."""
    fault_at = fault_at or min((t for t in (p.first_error_at() for p in run) if t is not None), default=None)
    return dict(fault=fault, processes=processes,
                seconds_to_exit=[None if fault_at is None else round(p.exited_at - fault_at, 2) for p in run],
                exit_codes=[p.process.returncode for p in run], stderr_lines=[len(p.error_lines()) for p in run],
                lines=[p.error_lines()[-1][:300] if p.error_lines() else "" for p in run], **extra)


def relaunched(runs: Runs, workdir, processes: int, reference: dict[int, float], *flags, env=None) -> dict:
    """Run the same command again to STEPS: the step it resumed from, and whether its losses are the reference's."""
    run = runs.complete(workdir, processes, f"--config.total_steps={STEPS}", *flags, env=env)
    losses = logged_losses(workdir)
    return dict(resumed_from=resumed_step(run), relaunch_exit_codes=[p.process.returncode for p in run],
                bit_exact=losses == reference)


# ---- The faults -------------------------------------------------------------------------------------------------


def signal_fault(runs, processes, reference, victim: int, signum: int) -> dict | None:
    if victim >= processes:
        return None
    workdir = runs.folder / f"{signum}-{victim}-{processes}"
    run = runs.start(workdir, processes, f"--config.total_steps={STEPS}")
    wait_for_steps(run, workdir, FAULT_AT)
    fault_at = time.monotonic()
    os.kill(run[victim].process.pid, signum)
    survivors = [p for i, p in enumerate(run) if i != victim]
    for p in survivors:
        p.finish()
    if signum == signal.SIGSTOP:
        os.kill(run[victim].process.pid, signal.SIGCONT)
    run[victim].finish()
    name = {signal.SIGKILL: "kill", signal.SIGSTOP: "freeze"}[signum]
    result = outcome(f"{name}_{victim}", processes, run, fault_at, bound_s=PEER_TIMEOUT_S + 15,
                     survivors=[i for i in range(processes) if i != victim])
    return {**result, **relaunched(runs, workdir, processes, reference)}


def hang(runs, processes, reference) -> dict:
    workdir = runs.folder / f"hang-{processes}"
    run = runs.start(workdir, processes, f"--config.total_steps={STEPS}", hang_at=FAULT_AT)
    wait_for_steps(run, workdir, FAULT_AT - 1)
    fault_at = time.monotonic()  # about when the stalled step starts
    for p in run:
        p.finish()
    result = outcome("hang", processes, run, fault_at, bound_s=WATCHDOG_S + 15)
    return {**result, **relaunched(runs, workdir, processes, reference)}


def disk_full(runs, processes, reference) -> dict:
    disk = runs.folder / f"disk-{processes}"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        workdir = disk / "run"
        run = runs.start(workdir, processes, f"--config.total_steps={STEPS}", "--config.checkpoint_every_steps=100")
        wait_for_steps(run, workdir, FAULT_AT)
        fault_at = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=1M"], capture_output=True)  # to full
        for p in run:
            p.finish()
        result = outcome("disk_full", processes, run, fault_at, bound_s=15)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)
    return result


def corrupt_shard(runs, processes, reference, prepared: pathlib.Path, prepare_command: list[str]) -> dict:
    import hashlib

    shards = sorted(prepared.glob("*.tfrecord"))
    victim = shards[processes - 1]  # shard k is read by process k mod processes
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])
    workdir = runs.folder / f"corrupt-{processes}"
    run = runs.complete(workdir, processes, f"--config.total_steps={STEPS}")
    result = outcome("corrupt_shard", processes, run, None, bound_s=15, workdir_created=workdir.exists())
    again = subprocess.run(prepare_command, cwd=runs.repo, env=runs.env, capture_output=True, text=True)
    repaired = hashlib.sha256(victim.read_bytes()).digest() == hashlib.sha256(whole).digest()
    return {**result, "prepare_again_exit_code": again.returncode, "shard_repaired": repaired}


def diverge(runs, processes, reference, nan_policy: str) -> dict:
    """Stopped by SIGTERM after 20 steps (the learning-rate schedule is the reference's), then resumed at a learning
    rate of 1e6 with a checkpoint every step until the run stops itself."""
    workdir = runs.folder / f"diverge-{nan_policy}-{processes}"
    policy, total = f"--config.nan_policy={nan_policy}", f"--config.total_steps={STEPS}"
    run = runs.start(workdir, processes, total, policy)
    wait_for_steps(run, workdir, 20)
    for p in run:
        p.process.send_signal(signal.SIGTERM)
        p.finish()
    rate = {"stop": 1e6, "skip": 1e30}[nan_policy]  # finite huge weights, a spike; weights that give NaN at once
    run = runs.complete(workdir, processes, total, "--config.checkpoint_every_steps=1",
                        f"--config.optimizer.learning_rate={rate:g}", policy)
    result = outcome(f"diverge_{nan_policy}", processes, run, None, bound_s=15)
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    aside = sorted(p.name for p in (workdir / "checkpoints").iterdir() if "diverged" in p.name)
    return {**result, "checkpoints": steps, "moved_aside": aside, **relaunched(runs, workdir, processes, reference,
                                                                              policy)}


def bucket(runs, processes, reference, server: GcsServer, prepared: pathlib.Path, outage: bool) -> dict:
    from bert_jax import storage

    env = {**os.environ, **server.env()}
    base = f"gs://{server.bucket}/faults-{'outage' if outage else 'flaky'}-{processes}"
    with patched_environ(env):
        for shard in prepared.iterdir():
            storage.atomic_write(f"{base}/prepared/{shard.name}", shard.read_bytes())
    proxy = FlakyProxy(server, rate=0.0 if outage else 0.02, seed=processes)
    flags = [f"--config.data.prepared_dir={base}/prepared", "--config.data.input_files=",
             f"--config.total_steps={STEPS}", "--config.watchdog_s=300"]  # the outage's own error comes first
    workdir = f"{base}/run"
    try:
        run = runs.start(workdir, processes, *flags, env=proxy.env())
        if not outage:
            for p in run:
                p.finish()
            with patched_environ(env):
                losses = logged_losses(workdir)
            return dict(fault="flaky_bucket", processes=processes, exit_codes=[p.process.returncode for p in run],
                        stderr_lines=[len(p.error_lines()) for p in run], lines=[p.error_lines() for p in run],
                        injected=proxy.faults,
                        requests=proxy.requests, bit_exact=losses == reference)
        with patched_environ(env):
            wait_for_steps(run, workdir, FAULT_AT)
        fault_at, proxy.rate = time.monotonic(), 1.0
        for p in run:
            p.finish(timeout=1800)
        return outcome("outage", processes, run, fault_at, bound_s=None, injected=proxy.faults)
    finally:
        proxy.stop()


def long_compile(runs, processes) -> dict | None:
    """BERT-base on 2 processes, peer_timeout_s=3, 2 busy processes beside: the seconds to its first logged step
    (compiling, mostly) and whether the heartbeat timeout fired meanwhile."""
    if processes != 2:
        return None
    workdir = runs.folder / "long-compile"
    with busy_beside(2):
        started = time.monotonic()
        run = runs.start(workdir, 2, "--config=configs/bert.py:base", "--config.total_steps=2",
                         "--config.data.batch_size=2", "--config.data.seq_length=128",
                         "--config.masking.max_predictions_per_seq=20", "--config.distributed.peer_timeout_s=3")
        first_step = None
        while any(p.exited_at is None for p in run):
            if first_step is None and logged_losses(workdir):
                first_step = time.monotonic() - started
            time.sleep(0.2)
    return dict(fault="long_compile", processes=2, exit_codes=[p.process.returncode for p in run],
                stderr_lines=[len(p.error_lines()) for p in run], peer_timeout_s=3,
                seconds_to_first_step=None if first_step is None else round(first_step, 1),
                lines=[p.error_lines()[-1][:300] if p.error_lines() else "" for p in run])


@contextlib.contextmanager
def patched_environ(env: dict):
    """This process's bucket clients pointed at the server (without the proxy), for the benchmark's own reads."""
    from gcs_server import use

    saved = dict(os.environ)
    os.environ.update(env)
    use(type("Server", (), {"env": lambda self: env})())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---- The stalled child of `hang` ----------------------------------------------------------------------------------


def hung_training(hang_at: int, argv: list[str]) -> None:
    """bert_jax.train whose last process stops in its input at step `hang_at` (the thread waits forever while the
    process, its heartbeats and its watchdog live on)."""
    import jax

    from bert_jax import cli, train

    batches, make = [0], train.global_batch

    def global_batch(local_batch, batch_sharding):
        batches[0] += 1
        if batches[0] == hang_at and jax.process_index() == jax.process_count() - 1:
            threading.Event().wait()
        return make(local_batch, batch_sharding)

    train.global_batch = global_batch
    sys.argv = [sys.argv[0], *argv]
    cli.run(train.command(train.train_and_evaluate))


def main():
    flags, rest = PARSER.parse_known_args()
    if flags.hang_at:
        hung_training(flags.hang_at, rest[1:] if rest[:1] == ["--"] else rest)
    chosen = flags.faults.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="bert_jax-faults-") as folder:
        folder = pathlib.Path(folder)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu",
               "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo", "JAX_COMPILATION_CACHE_DIR": str(folder / "xla-cache"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "EPATH_USE_TF": "false"}
        prepared = folder / "prepared"
        prepare_command = [sys.executable, "-m", "bert_jax.input_pipeline.prepare",
                           f"--tokenizer={REPO_ROOT}/data/bert-base-uncased/vocab.txt", f"--output={prepared}",
                           "--num_workers=1", "--docs_per_shard=10", *map(str, sorted((REPO_ROOT / "data" /
                                                                                          "corpus").glob("*.txt")))]
        subprocess.run(prepare_command, cwd=flags.repo, env=env, check=True, capture_output=True)
        TRAIN.extend([f"--config.data.prepared_dir={prepared}", "--config.data.input_files="])
        runs = Runs(flags.repo, folder, env)
        server = GcsServer() if {"flaky_bucket", "outage"} & set(chosen) else None
        try:
            for processes in map(int, flags.processes.split(",")):
                reference_dir = folder / f"reference-{processes}"
                runs.complete(reference_dir, processes, f"--config.total_steps={STEPS}")
                reference = logged_losses(reference_dir)
                cases = {
                    "kill_1": lambda: signal_fault(runs, processes, reference, 1, signal.SIGKILL),
                    "kill_0": lambda: signal_fault(runs, processes, reference, 0, signal.SIGKILL),
                    "freeze_1": lambda: signal_fault(runs, processes, reference, 1, signal.SIGSTOP),
                    "hang": lambda: hang(runs, processes, reference),
                    "disk_full": lambda: disk_full(runs, processes, reference),
                    "corrupt_shard": lambda: corrupt_shard(runs, processes, reference, prepared, prepare_command),
                    "diverge_stop": lambda: diverge(runs, processes, reference, "stop"),
                    "diverge_skip": lambda: diverge(runs, processes, reference, "skip"),
                    "flaky_bucket": lambda: bucket(runs, processes, reference, server, prepared, outage=False),
                    "outage": lambda: bucket(runs, processes, reference, server, prepared, outage=True),
                    "long_compile": lambda: long_compile(runs, processes),
                }
                for fault in chosen:
                    with busy_beside(flags.load):
                        result = cases[fault]()
                        load_average = os.getloadavg()[0]
                    if result is not None:
                        results.append({**result, "busy_processes": flags.load, "load_average": round(load_average, 1)})
                        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            if server is not None:
                server.stop()
            shutil.rmtree(folder, ignore_errors=True)
    columns = (("fault", 14), ("processes", 10), ("seconds_to_exit", 22), ("bound_s", 8), ("exit_codes", 14),
               ("stderr_lines", 13), ("resumed_from", 13), ("bit_exact", 10))
    print("".join(f"{name:>{width}}" for name, width in columns))
    for r in results:
        print("".join(f"{str(r.get(name, '')):>{width}}" for name, width in columns))
    print(json.dumps({"runs": results}))


if __name__ == "__main__":
    main()
