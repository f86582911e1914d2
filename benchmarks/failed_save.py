"""How many steps a pretraining run makes after an asynchronous checkpoint write has failed, before it stops: a full
disk, on a quiet and a loaded machine.

    python benchmarks/failed_save.py [--load=0,4] [--repeats=1] [--disk_mb=40] [--repo=DIR]

Each run trains configs/bert.py:tiny (`python -m bert_jax.train`, a row in metrics.jsonl per step, a save every 5
steps) in a --disk_mb tmpfs (mounting one needs root), which holds the first checkpoint of its train state (~26 MB)
but not the second. From outside it follows the logged steps and the disk's free space every 5 ms: the write fails
when the disk is at its fullest (Orbax then removes the failed step's files), so it reports the last step logged
before that moment, the step the run stopped at and its error line. --load=N runs N busy processes beside it from
its first logged step on.
Prints a table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from signal_exit import REPO_ROOT, Watched, busy_beside, logged_steps, wait_for_steps

SAVE_EVERY = 5

PARSER = argparse.ArgumentParser(description=__doc__.split("\n")[0])
PARSER.add_argument("--load", default="0,4", help="Busy processes beside the run, comma-separated settings.")
PARSER.add_argument("--repeats", type=int, default=1, help="Runs per setting.")
PARSER.add_argument("--disk_mb", type=int, default=40, help="Size of the tmpfs the workdir is on.")
PARSER.add_argument("--repo", default=str(REPO_ROOT), help="The checkout whose bert_jax runs (default: this one).")


def free_bytes(folder: pathlib.Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def one_run(load: int, disk_mb: int, repo: str, cache: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache}
    with tempfile.TemporaryDirectory(prefix="bert_jax-failed-save-") as folder:
        disk = pathlib.Path(folder)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m", "tmpfs", str(disk)], check=True)
        try:
            workdir = disk / "run"
            run = Watched([sys.executable, "-m", "bert_jax.train", "--config=configs/bert.py:tiny",
                           f"--workdir={workdir}", "--config.total_steps=100000", "--config.log_every_steps=1",
                           f"--config.checkpoint_every_steps={SAVE_EVERY}", "--config.keep_checkpoints=5",
                           "--config.eval_every_steps=0", "--config.peak_flops=1e12"], repo, env)
            wait_for_steps([run], workdir / "metrics.jsonl", 1)
            with busy_beside(load):
                least_free, full_after_step = free_bytes(disk), None
                while run.exited_at is None:
                    free = free_bytes(disk)
                    if free < least_free:
                        least_free, full_after_step = free, logged_steps(workdir / "metrics.jsonl")
                    time.sleep(0.005)
                load_average = os.getloadavg()[0]
            stopped_at = logged_steps(workdir / "metrics.jsonl")
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=True)
    errors = [line for _, line in run.lines if line.startswith("error: ")]
    return dict(busy_processes=load, load_average=round(load_average, 1), exit_code=run.process.returncode,
                least_free_kib=least_free >> 10,
                error=errors[-1] if errors else None, disk_full_after_step=full_after_step, stopped_at_step=stopped_at,
                steps_after_the_failure=None if full_after_step is None else stopped_at - full_after_step)


def main():
    flags = PARSER.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bert_jax-failed-save-cache-") as cache:
        for load in map(int, flags.load.split(",")):
            for _ in range(flags.repeats):
                results.append(one_run(load, flags.disk_mb, flags.repo, cache))
                print(json.dumps(results[-1]), file=sys.stderr)
    print(f"{'busy':>5}{'load':>6}{'disk full after step':>22}{'stopped at step':>17}{'steps after':>13}  error")
    for r in results:
        print(f"{r['busy_processes']:>5}{r['load_average']:>6}{r['disk_full_after_step']!s:>22}"
              f"{r['stopped_at_step']:>17}{r['steps_after_the_failure']!s:>13}  {r['error']}")
    print(json.dumps({"runs": results, "most_steps_after_the_failure": max(
        (r["steps_after_the_failure"] for r in results if r["steps_after_the_failure"] is not None), default=None)}))


if __name__ == "__main__":
    main()
