"""`make bench`: run the CPU benchmarks one after another and write benchmarks/RESULTS.md.

Each benchmark is a script whose last printed line is JSON; this collects those lines with the date and the machine,
keeps the sections already in RESULTS.md that other scripts' figures fill ("## Sharding", "## Device check"), and
prints one JSON line of everything at the end.
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
KEPT_FROM = "\n## "
DEVICE_SECTION = "## Device check"
BENCHMARKS = {
    "input_pipeline": ["input_pipeline.py"],
    "train_step bert-base": ["train_step.py", "--model=bert-base", "--batch=8", "--seq=128"],
    "train_step electra-small": ["train_step.py", "--model=electra-small", "--batch=8", "--seq=128"],
    "embed": ["embed.py"],
    "packing": ["packing.py"],
}


def run(script_and_args: list[str]) -> dict:
    """Run one benchmark, echoing its output; its last line is its JSON figures."""
    completed = subprocess.run([sys.executable, str(HERE / script_and_args[0]), *script_and_args[1:]],
                               capture_output=True, text=True, check=True)
    print(completed.stdout, end="")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def kept_sections() -> str:
    """Everything from the first "## " heading on: sections written by hand from scripts make bench does not run."""
    text = RESULTS.read_text() if RESULTS.exists() else ""
    return text[text.index(KEPT_FROM):].lstrip("\n") if KEPT_FROM in text else (
        f"{DEVICE_SECTION}\n\nNot run yet: `python benchmarks/device_check.py --out=FILE.json` on one accelerator "
        "(docs/device_check.md).\n")


def markdown(results: dict) -> str:
    today = datetime.date.today().isoformat()
    lines = [f"# Benchmark results\n\n{today} on {machine_description()}, by `make bench`.\n",
             "| benchmark | figures |", "|---|---|"]
    for name, figures in results.items():
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        lines.append(f"| {name} | {shown} |")
    return "\n".join(lines) + "\n\n" + kept_sections()


def main() -> None:
    results = {name: run(args) for name, args in BENCHMARKS.items()}
    RESULTS.write_text(markdown(results))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
