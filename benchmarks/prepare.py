"""Corpus preparation speed and memory: the local driver and Beam's DirectRunner on the bundled corpus repeated to
--size_mb, and where one worker's time goes.

    python benchmarks/prepare.py [--size_mb=1000] [--files=16] [--workers=2] [--beam_python=PATH]

The corpus (data/corpus/*.txt, 1.5 MB) is repeated into --files text files of size_mb/files MB each (one unit
each). Each driver runs as the `prepare` command in its own subprocess with --workers worker processes
(DirectRunner: direct_running_mode=multi_processing); Beam runs under --beam_python (this Python by default), which
needs the `beam` extra (docs/data.md); the DirectRunner is left out when it has no Beam. Per driver: wall seconds,
MB/s of text and tokens/s (start-up included); CPU seconds of the whole process tree and MB per CPU second, the
figure that holds on a machine shared with other work and that sizes a cluster; and two memory peaks: the largest single
process (ru_maxrss of the children, via os.wait4) and the whole process tree (the sum of its RSS, sampled every
0.2 s). The profile tokenizes --profile_mb
in this process, one core, to split one worker's time into reading text, tokenizing, and serializing + writing.
Prints a table and, last, one JSON line of the figures.
"""
import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from absl import app, flags

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = sorted((REPO_ROOT / "data" / "corpus").glob("*.txt"))
VOCAB = REPO_ROOT / "data" / "bert-base-uncased" / "vocab.txt"

FLAGS = flags.FLAGS
flags.DEFINE_integer("size_mb", 1000, "Corpus size in MB (10**6 bytes), the bundled corpus repeated.")
flags.DEFINE_integer("files", 16, "How many files (units) the corpus is split into.")
flags.DEFINE_integer("workers", os.cpu_count() or 1, "Worker processes per driver.")
flags.DEFINE_string("beam_python", sys.executable, "A Python that has apache-beam (the `beam` extra).")
flags.DEFINE_integer("profile_mb", 8, "Text tokenized in this process for the time split of one worker.")


def write_corpus(folder: pathlib.Path, size: int, files: int) -> list[pathlib.Path]:
    """`files` files of size/files bytes of the bundled corpus repeated, each ending at a document break."""
    text = b"\n\n".join(path.read_bytes().strip() for path in CORPUS) + b"\n\n"
    copies, rest = divmod(size // files, len(text))
    tail = text[:rest].rsplit(b"\n\n", 1)[0] + b"\n\n" if b"\n\n" in text[:rest] else b""
    paths = []
    for i in range(files):
        path = folder / f"corpus-{i:03d}.txt"
        with path.open("wb") as f:
            for _ in range(copies):
                f.write(text)
            f.write(tail)
        paths.append(path)
    return paths


def tree_rss(process: psutil.Process) -> int:
    """RSS of a process and all its descendants, in bytes (0 once it is gone)."""
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_driver(command: list[str], log: pathlib.Path) -> dict:
    """Run a prepare command to its end: wall seconds, peak RSS (largest process; whole tree, sampled)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    peak, done = [0], threading.Event()
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        watched = psutil.Process(process.pid)

        def sample():
            while not done.wait(0.2):
                peak[0] = max(peak[0], tree_rss(watched))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        sampler.join()
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{command[:4]} failed; its log:\n{log.read_text()[-3000:]}")
    return dict(seconds=round(seconds, 1), cpu_seconds=round(usage.ru_utime + usage.ru_stime, 1),
                peak_rss_mb_process=round(usage.ru_maxrss / 1024),
                peak_rss_mb_tree=round(peak[0] / 2**20))


def has_beam(python: str) -> bool:
    return subprocess.run([python, "-c", "import apache_beam"], capture_output=True).returncode == 0


def profile(size: int) -> dict:
    """One worker's CPU seconds (all its threads) on `size` bytes of text: reading and splitting, tokenizing,
    serializing and writing."""
    from bert_jax import storage
    from bert_jax.input_pipeline import documents, tokenizers
    tokenizer = tokenizers.load_tokenizer("wordpiece", str(VOCAB), True)
    documents.serialize(*next(iter(documents.tokenize_files(CORPUS[:1], tokenizer, documents.new_counts()))))
    with tempfile.TemporaryDirectory(prefix="bert_jax-prepare-profile-") as folder:
        [text] = write_corpus(pathlib.Path(folder), size, 1)
        counts, times = documents.new_counts(), {}
        start = time.process_time()
        docs = list(documents.read_documents(text, counts))
        times["read_s"] = time.process_time() - start
        start = time.process_time()
        tokenized = list(documents.tokenize_documents(docs, tokenizer, counts))
        times["tokenize_s"] = time.process_time() - start
        start = time.process_time()
        storage.write_records(pathlib.Path(folder) / "shard.tfrecord", (documents.serialize(*d) for d in tokenized))
        times["serialize_write_s"] = time.process_time() - start
        mb = text.stat().st_size / 1e6
    total = sum(times.values())
    return dict({k: round(v, 2) for k, v in times.items()}, mb=round(mb, 1), mb_per_cpu_s=round(mb / total, 2),
                tokens_per_cpu_s=round(counts["tokens"] / total),
                **{k.replace("_s", "_share"): round(v / total, 3) for k, v in times.items()})


def main(argv):
    del argv
    results = {}
    with tempfile.TemporaryDirectory(prefix="bert_jax-prepare-bench-") as folder:
        folder = pathlib.Path(folder)
        (folder / "text").mkdir()
        files = write_corpus(folder / "text", FLAGS.size_mb * 10**6, FLAGS.files)
        mb = sum(f.stat().st_size for f in files) / 1e6
        drivers = {"local": [sys.executable, "--runner=local", f"--num_workers={FLAGS.workers}"]}
        if has_beam(FLAGS.beam_python):
            drivers["beam_direct"] = [FLAGS.beam_python, "--runner=DirectRunner", "--",
                                      "--direct_running_mode=multi_processing", f"--direct_num_workers={FLAGS.workers}"]
        else:
            print(f"{FLAGS.beam_python} has no apache_beam: DirectRunner left out", file=sys.stderr)
        summaries = {}
        for name, (python, *options) in drivers.items():
            out = folder / name
            results[name] = run_driver([python, "-m", "bert_jax.input_pipeline.prepare", f"--tokenizer={VOCAB}",
                                        f"--output={out}", *map(str, files), *options], folder / f"{name}.log")
            summaries[name] = json.loads((out / "summary.json").read_text())
            shards = sorted(out.glob("*.tfrecord"))
            results[name]["shard_bytes_mb"] = round(sum(s.stat().st_size for s in shards) / 1e6, 1)
            results[name]["mb_per_s"] = round(mb / results[name]["seconds"], 2)
            results[name]["mb_per_cpu_s"] = round(mb / results[name]["cpu_seconds"], 2)
            results[name]["tokens_per_s"] = round(summaries[name]["tokens"] / results[name]["seconds"])
        if len(summaries) == 2:
            same = all(a.read_bytes() == b.read_bytes() for a, b in itertools.zip_longest(
                sorted((folder / "local").glob("*.tfrecord")), sorted((folder / "beam_direct").glob("*.tfrecord")),
                fillvalue=folder / "missing"))
            results["identical_shards"] = same and summaries["local"] == summaries["beam_direct"]
    tokens = summaries["local"]["tokens"]
    results["profile"] = profile(FLAGS.profile_mb * 10**6)
    print(f"corpus: {mb:.0f} MB in {FLAGS.files} files, {tokens} tokens; {FLAGS.workers} workers; "
          f"{os.cpu_count()} CPUs")
    print(f"{'driver':<13}{'seconds':>9}{'MB/s':>8}{'tokens/s':>11}{'CPU s':>8}{'MB/CPU s':>10}"
          f"{'peak MB (process)':>19}{'peak MB (tree)':>16}")
    for name in drivers:
        r = results[name]
        print(f"{name:<13}{r['seconds']:>9}{r['mb_per_s']:>8}{r['tokens_per_s']:>11}{r['cpu_seconds']:>8}"
              f"{r['mb_per_cpu_s']:>10}{r['peak_rss_mb_process']:>19}{r['peak_rss_mb_tree']:>16}")
    p = results["profile"]
    print(f"one worker, {p['mb']} MB in this process: {p['mb_per_cpu_s']} MB and {p['tokens_per_cpu_s']} tokens per "
          f"CPU second; CPU in reading {p['read_share']:.0%}, tokenizing {p['tokenize_share']:.0%}, "
          f"serializing+writing {p['serialize_write_share']:.0%}")
    print(json.dumps(dict(size_mb=round(mb), files=FLAGS.files, workers=FLAGS.workers, cpus=os.cpu_count(),
                          tokens=tokens, **results)))


if __name__ == "__main__":
    app.run(main)
