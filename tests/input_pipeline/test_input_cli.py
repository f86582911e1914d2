"""The inspect and train_tokenizer command lines, run as users run them."""
import json
import os
import subprocess
import sys

from bert_jax import config_lib
from bert_jax.input_pipeline import inspect
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.pipeline import PretrainingPipeline
from bert_jax.input_pipeline.tokenizers import load_tokenizer

KEYS = ["tokens", "input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
        "masked_lm_weights"]


def run_module(module, *args, cwd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_inspect_cli_with_no_data_arguments(tmp_path):
    out = run_module("bert_jax.input_pipeline.inspect", f"--config={REPO_ROOT}/configs/bert.py:tiny", "--epoch=2",
                     "--num_batches=2", "--config.data.batch_size=3", cwd=tmp_path)  # not the repo root
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 6
    for r in records:
        assert list(r) == KEYS + ["next_sentence_label"]
        assert r["tokens"][0] == "[CLS]" and len(r["tokens"]) == len(r["input_ids"]) == sum(r["input_mask"])
        assert r["tokens"].count("[SEP]") == 2 and r["next_sentence_label"] in (0, 1)
        assert len(r["masked_lm_positions"]) == len(r["masked_lm_ids"]) == sum(r["masked_lm_weights"]) >= 1


def test_inspect_records_for_sop_in_process():
    config = config_lib.load_preset("albert", "tiny")
    config.data.batch_size = 4
    pipeline = PretrainingPipeline(config)
    records = list(inspect.example_records(pipeline, epoch=0, num_batches=1))
    assert len(records) == 4 and all(list(r) == KEYS + ["sentence_order_label"] for r in records)
    # Epoch 1 shows other examples (a new permutation) with other masks.
    later = list(inspect.example_records(pipeline, epoch=1, num_batches=1))
    assert [r["input_ids"] for r in later] != [r["input_ids"] for r in records]


def test_train_tokenizer_cli(tmp_path):
    run_module("bert_jax.input_pipeline.train_tokenizer", "--kind=bpe", "--vocab_size=600", f"--output={tmp_path}",
               str(REPO_ROOT / "data" / "corpus" / "chesterton-brown.txt"), cwd=tmp_path)
    tokenizer = load_tokenizer("bpe", tmp_path)
    assert tokenizer.vocab_size == 600 and tokenizer.special.mask == 4
