"""The pod workflow end to end, in a bucket on a real GCS server on localhost (tests/gcs_server.py).

Prepare a corpus gs:// -> gs://; pretrain a tiny BERT on 2 processes (jax.distributed, gloo) that share a gs://
workdir and read gs:// shards; stop it with SIGTERM; leave a half-written later step behind (what kill -9 during a
save leaves); resume. The losses must equal those of an uninterrupted 2-process run on local copies, bit for bit.
Then load_pretrained / save_pretrained round-trip through the bucket.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax import storage
from gcs_server import free_port
from train_helpers import XLA_CACHE_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS, STOP_AFTER = 24, 3  # after compiling, a step takes well under a second: leave the signal room


def run_env(gcs_server) -> dict:
    return {**os.environ, **gcs_server.env(), "JAX_PLATFORMS": "cpu",
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo", "TF_CPP_MIN_LOG_LEVEL": "2",
            # Every compile is cached, however short: the 3 runs here are one program, and the runs started after the
            # reference's first step (its process 0 writes the cache) load theirs instead of compiling them again.
            "JAX_COMPILATION_CACHE_DIR": XLA_CACHE_DIR, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def start_pair(workdir: str, prepared: str, vocab: str, env: dict) -> list[subprocess.Popen]:
    """Both processes of a 2-host training run."""
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "bert_jax.train", "--config=configs/bert.py:tiny", f"--workdir={workdir}",
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}",
         f"--config.data.prepared_dir={prepared}", "--config.data.input_files=",
         f"--config.data.tokenizer_path={vocab}",
         "--config.data.seq_length=32", "--config.data.batch_size=8", "--config.masking.max_predictions_per_seq=5",
         f"--config.total_steps={STEPS}", "--config.log_every_steps=1", "--config.checkpoint_every_steps=100",
         "--config.eval_every_steps=0", "--config.peak_flops=1e9", "--config.optimizer.warmup_steps=2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]


def wait_for_steps(processes: list[subprocess.Popen], metrics: storage.Path, steps: int, what: str) -> None:
    """Until `steps` rows are in `metrics` (fails, with the output, if a process exits first or 10 minutes pass)."""
    deadline = time.monotonic() + 600
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            for p in processes:
                p.kill()
            pytest.fail(f"the {what} did not start: " + processes[0].communicate()[0][-3000:])
        time.sleep(0.2)


def finish(processes: list[subprocess.Popen], timeout: float = 600) -> list[str]:
    outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    for p, output in zip(processes, outputs):
        assert p.returncode == 0, output[-4000:]
    return outputs


def losses(workdir) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (storage.as_path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows]


def steps_saved(workdir) -> list[int]:
    folder = storage.as_path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists())


def copy_tree(source, target) -> None:
    for path in storage.as_path(source).iterdir():
        if path.is_dir():
            copy_tree(path, storage.as_path(target) / path.name)
        else:
            storage.make_dirs(target)
            (storage.as_path(target) / path.name).write_bytes(path.read_bytes())


def test_two_hosts_in_a_bucket_survive_sigterm_and_match_a_local_run(gcs_server, bucket_dir, tmp_path):
    env = run_env(gcs_server)
    started = time.perf_counter()
    corpus = sorted((REPO / "data" / "corpus").glob("*.txt"))
    for file in corpus:
        storage.atomic_write(f"{bucket_dir}/corpus/{file.name}", file.read_bytes())
    vocab = f"{bucket_dir}/vocab.txt"
    storage.atomic_write(vocab, (REPO / "data" / "bert-base-uncased" / "vocab.txt").read_bytes())

    # ---- prepare from the bucket into the bucket; a local copy of the shards feeds the reference run -------------
    prepared = f"{bucket_dir}/prepared"
    subprocess.run([sys.executable, "-m", "bert_jax.input_pipeline.prepare", f"--tokenizer={vocab}",
                    f"--output={prepared}", "--num_workers=1", *(f"{bucket_dir}/corpus/{f.name}" for f in corpus)],
                   cwd=REPO, env=env, check=True, timeout=600)
    copy_tree(prepared, tmp_path / "prepared")
    local_vocab = REPO / "data" / "bert-base-uncased" / "vocab.txt"

    # ---- the bucket run, stopped by SIGTERM, and the uninterrupted local reference, side by side ----------------
    run = f"{bucket_dir}/run"
    # The bucket run starts once the reference has compiled (its first step logged): it loads the reference's
    # compiled programs from the cache while the reference finishes, instead of compiling the same ones beside it.
    reference = start_pair(str(tmp_path / "reference"), str(tmp_path / "prepared"), str(local_vocab), env)
    wait_for_steps(reference, tmp_path / "reference" / "metrics.jsonl", 1, "reference run")
    first = start_pair(run, prepared, vocab, env)
    wait_for_steps(first, storage.as_path(run) / "metrics.jsonl", STOP_AFTER, "bucket run")
    for p in first:
        p.send_signal(signal.SIGTERM)
    outputs = finish(first)
    stopped_at = steps_saved(run)
    assert len(stopped_at) == 1 and STOP_AFTER <= stopped_at[0] < STEPS, (stopped_at, outputs[0][-2000:])

    # A save killed half-way leaves a step folder without its commit marker: resume must pass over it.
    torn = storage.as_path(run) / "checkpoints" / str(stopped_at[0] + 1)
    copy_tree(storage.as_path(run) / "checkpoints" / str(stopped_at[0]) / "params", torn / "params")
    outputs += finish(start_pair(run, prepared, vocab, env))
    outputs += finish(reference)
    assert f"resuming from {run}/checkpoints at step {stopped_at[0]}" in outputs[2]

    resumed, straight = losses(run), losses(tmp_path / "reference")
    assert [s for s, _ in resumed] == list(range(1, STEPS + 1))  # no step logged twice
    assert resumed == straight  # bit for bit
    assert steps_saved(run)[-1] == STEPS

    # ---- load_pretrained / save_pretrained through the bucket (a fine-tune from a bucket: test_finetune_buckets) -
    from bert_jax import load_pretrained, save_pretrained

    model = load_pretrained(run)
    save_pretrained(model, f"{bucket_dir}/hf", format="hf")
    again = load_pretrained(f"{bucket_dir}/hf", head=model.head)
    for a, b in zip(*(sorted(leaves(m.params)) for m in (model, again))):
        np.testing.assert_array_equal(a[1], b[1])
    print(json.dumps({"e2e_seconds": round(time.perf_counter() - started, 1), "steps": STEPS,
                      "resumed_from": stopped_at[0], "losses_equal": resumed == straight}))


def leaves(params) -> list:
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(params)
    return [(jax.tree_util.keystr(path), np.asarray(leaf)) for path, leaf in leaves]
