"""ModernBERT's three training phases at tiny scale on the bundled corpus (docs/recipes.md), each checked for exact
resume, with the loss at every phase boundary.

    python benchmarks/three_phases.py [--out=runs/three-phases]

Runs the three commands of docs/recipes.md one after the other, each saving a checkpoint half-way too. Each phase is
then run again from that half-way checkpoint with the same command (a restart after a stop), and must reach the same
metrics (loss, masked-LM accuracy, learning rate, batch size, packing efficiency) and the same parameters. The last
line printed is JSON: the loss of the first and last logged steps of each phase (means over 10 steps), the eval loss
at its end (phases 2 and 3 share their eval batches), whether each resumed exactly, and the minutes taken.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/three-phases", "Where the phases' workdirs and their restarts go (replaced).")

REPO = pathlib.Path(__file__).resolve().parent.parent
# The commands of docs/recipes.md (their flags after --workdir), with {previous} the previous phase's workdir.
PHASES = {
    "phase1": ["--config.total_steps=60", "--config.optimizer.decay_fraction=0",
               "--config.batch_warmup.start=8", "--config.batch_warmup.tokens=49152"],
    "phase2": ["--config.total_steps=30", "--config.init_from={previous}", "--config.init_from_optimizer=true",
               "--config.data.seq_length=512", "--config.data.batch_size=8",
               "--config.masking.max_predictions_per_seq=160", "--config.model.global_rope_theta=160000",
               "--config.optimizer.learning_rate=4e-4", "--config.optimizer.warmup_steps=0",
               "--config.optimizer.decay_fraction=0"],
    "phase3": ["--config.total_steps=20", "--config.init_from={previous}", "--config.init_from_optimizer=true",
               "--config.data.seq_length=512", "--config.data.batch_size=8",
               "--config.masking.max_predictions_per_seq=160", "--config.optimizer.learning_rate=4e-4",
               "--config.optimizer.warmup_steps=0", "--config.optimizer.decay_fraction=1"],
}
TIMING = ("steps_per_second", "tokens_per_second", "mfu", "model_flops_per_step")


def command(phase: str, workdir: pathlib.Path, previous: pathlib.Path | None) -> list[str]:
    """The phase's documented command, logging every 10 steps and also saving half-way."""
    steps = int(PHASES[phase][0].split("=")[1])
    return [sys.executable, "-m", "bert_jax.train", "--config=configs/modernbert.py:tiny", f"--workdir={workdir}",
            *[f.format(previous=previous) for f in PHASES[phase]], "--config.log_every_steps=10",
            f"--config.checkpoint_every_steps={steps // 2}"]


def metrics(workdir: pathlib.Path) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def restart_from_half(workdir: pathlib.Path, restart: pathlib.Path) -> int:
    """A copy of the workdir as a run stopped at its half-way checkpoint left it; returns that step."""
    half = min(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    (restart / "checkpoints").mkdir(parents=True)
    shutil.copytree(workdir / "checkpoints" / str(half), restart / "checkpoints" / str(half))
    for name in ("config.json", "metrics.jsonl"):  # the rerun keeps the metrics rows up to its step
        shutil.copy(workdir / name, restart / name)
    return half


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
    shutil.rmtree(out, ignore_errors=True)
    report, previous = {}, None
    for phase in PHASES:
        workdir, restart = out / phase, out / f"{phase}-restarted"
        run(command(phase, workdir, previous))
        half = restart_from_half(workdir, restart)
        run(command(phase, restart, previous))
        rows = metrics(workdir)
        losses, eval_loss = [row["loss"] for row in rows if "loss" in row], rows[-1]["eval_loss"]
        exact = rows == metrics(restart) and same_params(workdir, restart)
        report[phase] = dict(first_loss=round(losses[0], 4), last_loss=round(losses[-1], 4),
                             eval_loss=round(eval_loss, 4), restarted_at=half, exact_resume=exact)
        print(f"{phase}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (every 10 steps: "
              f"{', '.join(f'{x:.3f}' for x in losses)}), eval loss at the end {eval_loss:.4f}; restarted from "
              f"step {half}: {'identical' if exact else 'DIFFERENT'} metrics and parameters", flush=True)
        previous = workdir
    report["minutes"] = round((time.perf_counter() - start) / 60, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    app.run(main)
