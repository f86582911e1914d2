"""Peak memory of reading one huge line: a --size_mb file of words without a single newline, through `prepare` and
through the training pipeline (`config.data.input_files`, first batch).

    python benchmarks/long_lines.py [--size_mb=50]

Each path runs in its own subprocess; its peak RSS is the kernel's ru_maxrss for that child (os.wait4, the figure
resource.getrusage(RUSAGE_CHILDREN) reports, but per child rather than the maximum over all children so far). The
floor is the same command on a small book (TensorFlow and the tokenizer alone take most of it). Absolute RSS depends
on the machine, so the figure to compare is the peak's ratio to the floor measured in the same invocation.
Prints a table and, last, one JSON line: {"size_mb": ..., "prepare": {...}, "pipeline": {...}}.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = REPO_ROOT / "data" / "corpus" / "chesterton-brown.txt"
VOCAB = REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt"
PIPELINE_ONE_BATCH = """
import sys
from bert_jax import config_lib
from bert_jax.input_pipeline import PretrainingPipeline
config = config_lib.load_preset("bert", "tiny")
config.data.input_files = sys.argv[1]
pipeline = PretrainingPipeline(config)
batch = next(pipeline.dataset().as_numpy_iterator())
print(f"{pipeline.num_examples} examples; first batch {batch['input_ids'].shape}")
"""

FLAGS = flags.FLAGS
flags.DEFINE_integer("size_mb", 50, "Size of the single line, in MB (10**6 bytes).")


def write_single_line(path: pathlib.Path, size: int) -> None:
    """`size` bytes of real prose (the sample corpus' words, repeated) with no newline anywhere."""
    words = " ".join(CORPUS.read_text(encoding="utf-8").split()).encode("utf-8") + b" "
    with path.open("wb") as f:
        for _ in range(size // len(words)):
            f.write(words)
        f.write(words[:size % len(words)].rstrip(b" ") + b".")


def peak_rss(command: list[str], log: pathlib.Path) -> dict:
    """Run `command` to its end; its peak RSS (MB), wall seconds, exit code and last line of output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return dict(peak_rss_mb=round(usage.ru_maxrss / 1024), seconds=round(time.perf_counter() - start, 1),
                exit_code=process.returncode, last_line=lines[-1][:200] if lines else "")


def main(argv):
    del argv
    with tempfile.TemporaryDirectory(prefix="bert_jax-long-lines-") as folder:
        folder = pathlib.Path(folder)
        text = folder / "one_line.txt"
        write_single_line(text, FLAGS.size_mb * 10**6)
        commands = {
            "prepare": lambda text, out: [sys.executable, "-m", "bert_jax.input_pipeline.prepare",
                                          f"--tokenizer={VOCAB}", f"--output={out}", "--num_workers=1", str(text)],
            "pipeline": lambda text, out: [sys.executable, "-c", PIPELINE_ONE_BATCH, str(text)],
        }
        results = {}
        for name, command in commands.items():
            floor = peak_rss(command(CORPUS, folder / "small"), folder / f"{name}-floor.log")
            large = peak_rss(command(text, folder / "large"), folder / f"{name}.log")
            results[name] = dict(large, floor_rss_mb=floor["peak_rss_mb"],
                                 peak_over_floor=round(large["peak_rss_mb"] / floor["peak_rss_mb"], 2))
    print(f"{'path':<10}{'peak RSS MB':>12}{'floor MB':>9}{'peak/floor':>11}{'seconds':>9}{'exit':>6}  last line")
    for name, r in results.items():
        print(f"{name:<10}{r['peak_rss_mb']:>12}{r['floor_rss_mb']:>9}{r['peak_over_floor']:>11}{r['seconds']:>9}"
              f"{r['exit_code']:>6}  {r['last_line']}")
    print(json.dumps(dict(size_mb=FLAGS.size_mb, **results)))


if __name__ == "__main__":
    app.run(main)
