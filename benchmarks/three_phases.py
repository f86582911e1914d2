"""ModernBERT's three training phases at tiny scale on the bundled corpus (docs/recipes.md), each checked for exact
resume, with the loss at every phase boundary.

    python benchmarks/three_phases.py [--out=runs/three-phases] [--scale=1.0]

Runs the three commands of docs/recipes.md twice: once straight through, once stopped by SIGTERM half-way through
each phase and restarted with the same command. Each phase's metrics (loss, masked-LM accuracy, learning rate, batch
size, packing efficiency) and final parameters must then be identical in both. --scale multiplies every phase's
steps (0.2 for a quick look). The last line printed is JSON: the mean loss of the first and last logged steps of
each phase, whether each resumed exactly, and the minutes taken.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/three-phases", "Where the two chains of three workdirs go (replaced).")
flags.DEFINE_float("scale", 1.0, "Multiply every phase's total_steps.")

REPO = pathlib.Path(__file__).resolve().parent.parent
# The commands of docs/recipes.md (their flags after --workdir), with {previous} the previous phase's workdir.
PHASES = {
    "phase1": ["--config.total_steps={steps}", "--config.optimizer.decay_fraction=0",
               "--config.batch_warmup.start=8", "--config.batch_warmup.tokens=245760"],
    "phase2": ["--config.total_steps={steps}", "--config.init_from={previous}", "--config.init_from_optimizer=true",
               "--config.data.seq_length=512", "--config.data.batch_size=8",
               "--config.masking.max_predictions_per_seq=160", "--config.model.global_rope_theta=160000",
               "--config.optimizer.learning_rate=4e-4", "--config.optimizer.warmup_steps=0",
               "--config.optimizer.decay_fraction=0"],
    "phase3": ["--config.total_steps={steps}", "--config.init_from={previous}", "--config.init_from_optimizer=true",
               "--config.data.seq_length=512", "--config.data.batch_size=8",
               "--config.masking.max_predictions_per_seq=160", "--config.optimizer.learning_rate=4e-4",
               "--config.optimizer.warmup_steps=0", "--config.optimizer.decay_fraction=1"],
}
STEPS = {"phase1": 300, "phase2": 100, "phase3": 60}
TIMING = ("steps_per_second", "tokens_per_second", "mfu", "model_flops_per_step")


def command(phase: str, workdir: pathlib.Path, previous: pathlib.Path | None) -> list[str]:
    steps = max(2, round(STEPS[phase] * FLAGS.scale))
    flags_ = [f.format(steps=steps, previous=previous) for f in PHASES[phase]]
    return [sys.executable, "-m", "bert_jax.train", "--config=configs/modernbert.py:tiny", f"--workdir={workdir}",
            "--config.log_every_steps=10", *flags_]


def metrics(workdir: pathlib.Path) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def run(cmd: list[str], stop_at_step: int | None = None) -> None:
    """Run a command; with stop_at_step, send it SIGTERM once its metrics.jsonl has logged that step."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics_file = pathlib.Path(cmd[4].split("=", 1)[1]) / "metrics.jsonl"
    while stop_at_step and proc.poll() is None:
        if metrics_file.exists() and any(json.loads(line)["step"] >= stop_at_step
                                         for line in metrics_file.read_text().splitlines() if line.strip()):
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.5)
    _, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")


def same_params(a: pathlib.Path, b: pathlib.Path) -> bool:
    import jax
    import numpy as np

    from bert_jax import load_pretrained
    left, right = load_pretrained(a).params, load_pretrained(b).params
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(left), jax.tree.leaves(right)))


def main(argv):
    del argv
    start = time.perf_counter()
    out = (REPO / FLAGS.out).resolve()
    subprocess.run(["rm", "-rf", str(out)], check=True)
    report, previous = {}, {"straight": None, "resumed": None}
    for phase in PHASES:
        dirs = {chain: out / chain / phase for chain in previous}
        run(command(phase, dirs["straight"], previous["straight"]))
        resumed = command(phase, dirs["resumed"], previous["resumed"])
        run(resumed, stop_at_step=max(1, round(STEPS[phase] * FLAGS.scale)) // 2)
        stopped_at = max(row["step"] for row in metrics(dirs["resumed"]))
        run(resumed)
        straight_rows, resumed_rows = metrics(dirs["straight"]), metrics(dirs["resumed"])
        losses = [row["loss"] for row in straight_rows if "loss" in row]
        report[phase] = dict(first_loss=round(losses[0], 4), last_loss=round(losses[-1], 4),
                             stopped_at=stopped_at, exact_resume=straight_rows == resumed_rows
                             and same_params(dirs["straight"], dirs["resumed"]))
        print(f"{phase}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (logged every 10 steps: "
              f"{', '.join(f'{x:.3f}' for x in losses)}); stopped at step {stopped_at} and resumed: "
              f"{'identical' if report[phase]['exact_resume'] else 'DIFFERENT'}")
        previous = dirs
    report["minutes"] = round((time.perf_counter() - start) / 60, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    app.run(main)
