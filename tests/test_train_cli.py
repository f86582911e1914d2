"""Every family pretrains from the command line on the bundled corpus: the loss falls and a checkpoint is left."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from train_helpers import XLA_CACHE_DIR

from bert_jax import workdir as workdir_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
STEPS = 50
# Short sequences and small batches keep each run to seconds.
COMMON = ["--config.data.seq_length=32", "--config.data.batch_size=8", "--config.masking.max_predictions_per_seq=5",
          f"--config.total_steps={STEPS}", "--config.log_every_steps=10", "--config.eval_every_steps=0",
          "--config.checkpoint_every_steps=20", "--config.peak_flops=1e9"]
# bert also evaluates, roberta also computes in bfloat16 (with float32 parameters).
FAMILY_FLAGS = {"bert": [f"--config.eval_every_steps={STEPS}"], "electra": [],
                "roberta": ["--config.model.dtype=bfloat16"], "albert": []}


def launch(family: str, workdir: pathlib.Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": XLA_CACHE_DIR,
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bert_jax.train", f"--config=configs/{family}.py:tiny",
                             f"--workdir={workdir}", *COMMON, *FAMILY_FLAGS[family], *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All four families, started together (compilation is mostly single-threaded, so they share the cores)."""
    root = tmp_path_factory.mktemp("cli")
    procs = {family: launch(family, root / family) for family in FAMILY_FLAGS}
    outputs = {family: proc.communicate(timeout=600)[0] for family, proc in procs.items()}
    return {family: (procs[family].returncode, outputs[family], root / family) for family in FAMILY_FLAGS}


@pytest.mark.parametrize("family", list(FAMILY_FLAGS))
def test_family_trains_from_the_cli(runs, family):
    returncode, output, workdir = runs[family]
    assert returncode == 0, output[-3000:]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(10, STEPS + 1, 10))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < first - 0.3, f"{family}: loss {first:.3f} -> {last:.3f}"
    assert {"tokens_per_second", "mfu", "model_flops_per_step", "learning_rate"} <= set(rows[-1])
    assert ("eval_loss" in rows[-1]) == (family == "bert")  # evaluation is on for bert only, to save time
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((workdir / workdir_lib.CONFIG_FILE).read_text())["model"]["family"] == family
    saved = sorted(int(p.name) for p in (workdir / workdir_lib.CHECKPOINT_DIR).iterdir() if p.name.isdigit())
    assert saved == [20, 40, 50]


def test_unknown_config_key_is_named(tmp_path):
    proc = launch("bert", tmp_path / "typo", "--config.optimizer.learning_rat=1e-3")
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "Traceback" not in output, output[-3000:]
    assert output.strip().splitlines()[-1] == ("error: --config.optimizer.learning_rat: configs/bert.py:tiny has no "
                                               "key 'learning_rat'; did you mean 'learning_rate'?")
    assert not (tmp_path / "typo").exists()


def test_a_missing_bucket_is_one_line_before_any_work(gcs_server):
    proc = launch("bert", "gs://no-such-bucket/run")
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, output[-3000:]
    assert "error: gs://no-such-bucket/run: the bucket gs://no-such-bucket does not exist" in output
    assert "Traceback" not in output
