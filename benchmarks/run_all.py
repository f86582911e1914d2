"""`make bench`: run the CPU benchmarks one after another and write benchmarks/RESULTS.md.

Each benchmark is a script whose last printed line is JSON; this collects those lines with the date and the machine,
keeps any GPU-check section already in RESULTS.md, and prints one JSON line of everything at the end.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import subprocess
import sys

from bert_jax.metrics_writer import machine_description

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
GPU_SECTION = "## GPU check"
BENCHMARKS = {
    "input_pipeline": ["input_pipeline.py"],
    "train_step bert-base": ["train_step.py", "--model=bert-base", "--batch=8", "--seq=128"],
    "train_step electra-small": ["train_step.py", "--model=electra-small", "--batch=8", "--seq=128"],
    "embed": ["embed.py"],
}


def run(script_and_args: list[str]) -> dict:
    """Run one benchmark, echoing its output; its last line is its JSON figures."""
    completed = subprocess.run([sys.executable, str(HERE / script_and_args[0]), *script_and_args[1:]],
                               capture_output=True, text=True, check=True)
    print(completed.stdout, end="")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def previous_gpu_section() -> str:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    return text[text.index(GPU_SECTION):] if GPU_SECTION in text else (
        f"{GPU_SECTION}\n\nNot run yet: `bash benchmarks/gpu_check.sh` on a machine with an NVIDIA GPU.\n")


def markdown(results: dict) -> str:
    lines = [f"# Benchmark results\n\n{datetime.date.today().isoformat()} on {machine_description()}, by `make bench`.\n",
             "| benchmark | figures |", "|---|---|"]
    for name, figures in results.items():
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        lines.append(f"| {name} | {shown} |")
    return "\n".join(lines) + "\n\n" + previous_gpu_section()


def main() -> None:
    results = {name: run(args) for name, args in BENCHMARKS.items()}
    RESULTS.write_text(markdown(results))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
