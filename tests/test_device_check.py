"""benchmarks/device_check.py at tiny sizes on the CPU: the code path an accelerator machine without network runs,
bert_jax beside its HF transformers peer (torch.compile with the eager backend: the code path, not inductor's C++)."""
import datetime
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys
import time
import types

import pytest

from train_helpers import XLA_CACHE_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent
# XLA's CPU compile is most of this test: the suite's cheaper passes (XLA_FLAGS, tests/conftest.py) are inherited, and
# the compiled programs kept for the next run.
FAST_COMPILE = {"JAX_COMPILATION_CACHE_DIR": XLA_CACHE_DIR, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}


def device_check(*flags: str) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, "benchmarks/device_check.py", "--cpu", *flags], cwd=REPO,
        env={**os.environ, **FAST_COMPILE, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ""}, capture_output=True,
        text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_device_check_cpu_path_runs_both_frameworks_and_writes_finite_figures_without_tensorflow(tmp_path):
    out = tmp_path / "check.json"
    completed = device_check(f"--out={out}", "--rounds=1")
    result = json.loads(out.read_text())
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == result

    assert result["tensorflow_imported"] is False
    assert result["all_finite"] is True and result["skipped"] == [] and result["unfinished"] == []
    assert result["platform"] == "cpu" and result["peak_flops"] > 0
    assert datetime.datetime.fromisoformat(result["date"]).tzinfo is not None
    assert {"jax", "jaxlib", "flax", "torch", "transformers"} <= set(result["versions"])
    # The tiny presets here (bert-tiny, modernbert-tiny); --cpu runs no large run, whose code is the base run's.
    assert result["bert_base_seq128"]["model"] == "bert-tiny"
    assert result["modernbert_base_seq1024"]["model"] == "modernbert-tiny"
    for run in ("bert_base_seq128", "modernbert_base_seq1024"):
        row = result[run]
        for key in ("tokens_per_s", "mfu", "model_flops_per_step", "step_seconds", "peer_eager_tokens_per_s",
                    "peer_compiled_tokens_per_s", "ratio_vs_eager", "ratio_vs_compiled"):
            assert positive(row[key]), (run, key)
        assert row["ratio_vs_eager"] == pytest.approx(row["tokens_per_s"] / row["peer_eager_tokens_per_s"])
        assert row["ratio_vs_compiled"] == pytest.approx(row["tokens_per_s"] / row["peer_compiled_tokens_per_s"])
        assert row["peer_attention"] == "sdpa"
    assert result["peer_compile_backend"] == "eager"
    agreement = result["loss_agreement"]
    assert agreement["steps"] == 3
    assert math.isfinite(agreement["loss_bfloat16"]) and math.isfinite(agreement["loss_float32"])
    assert agreement["abs_difference"] == abs(agreement["loss_bfloat16"] - agreement["loss_float32"])
    assert agreement["rel_difference"] < 1e-2  # bf16 activations drift, but not by a percent in three steps
    # Every attention candidate (JAX's XLA attention with the mask, key lengths or a window; Pallas' Triton kernel
    # with segment ids, interpreted) agrees with the reference at the real tokens, in bfloat16.
    assert set(result["attention"]) == {"bert_large_padded", "bert_large_packed", "modernbert_base_local"}
    for case, row in result["attention"].items():
        kernels = {name: entry for name, entry in row.items() if isinstance(entry, dict)}
        assert {"xla", "reference"} <= set(kernels) and not [k for k, e in kernels.items() if "error" in e], row
        for name, entry in kernels.items():
            assert positive(entry["ms"]) and entry["max_abs_difference_vs_xla"] < 2e-2, (case, name)
    assert "pallas_triton_segments" in result["attention"]["bert_large_packed"]
    assert "xla_lengths" in result["attention"]["modernbert_base_local"]
    variant = result["variants"]["scan_layers"]
    assert positive(variant["speedup"]) and variant["speedup"] == pytest.approx(
        variant["base_step_seconds"] / variant["step_seconds"])
    assert set(result["memory"]) == {"peak_bytes_in_use", "bytes_limit"}  # None on the CPU, bytes on a GPU


def test_profile_mode_sums_the_kernels_of_a_step(tmp_path):
    completed = device_check(f"--profile={tmp_path}", "--steps=1")
    row = json.loads(completed.stdout.strip().splitlines()[-1])
    assert pathlib.Path(row["trace"]).is_file() and str(tmp_path) in row["trace"]
    assert positive(row["device_ms_per_step"]) and row["top_kernels_ms_per_step"]
    assert sum(row["ms_per_step_by_kind"].values()) == pytest.approx(row["device_ms_per_step"])


ATTENTION = {"case": {"shape": [1, 8, 2, 4], "xla": {"ms": 1.0}}}  # one case, one kernel, as the part gives them


@pytest.fixture
def check(monkeypatch):
    """benchmarks/device_check.py as a module, with its parts faked (these tests are about running and saving them):
    the agreement gives bf16's loss back, the attention one kernel's time."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("device_check", REPO / "benchmarks" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "JaxRun", lambda config, batches: types.SimpleNamespace(first_pass_loss=1.0))
    monkeypatch.setattr(module, "loss_agreement", lambda run, batches, bf16: {"loss_bfloat16": bf16})
    monkeypatch.setattr(module, "attention_kernels", lambda on_gpu: ATTENTION)
    return module


def test_each_part_is_saved_as_it_finishes_so_a_stopped_run_keeps_it(check):
    """run_check hands the figures to `save` after every part, naming the parts still to run: the device's time limit
    may stop the run in any part."""
    saved = []
    args = types.SimpleNamespace(only="attention,agreement", budget_s=1e9, steps=1)
    result = check.run_check(args, check.CPU_RUNS, [], 1, 1.0, time.perf_counter(),
                             lambda figures: saved.append(json.loads(json.dumps(figures))))
    assert [figures["unfinished"] for figures in saved] == [["attention"], []]  # PARTS' order, not --only's
    assert saved[0]["loss_agreement"] == {"loss_bfloat16": 1.0} and "attention" not in saved[0]
    assert saved[1]["attention"] == ATTENTION and set(saved[1]["part_seconds"]) == {"agreement",
                                                                                                  "attention"}
    assert result == saved[-1]


def test_a_failing_part_is_saved_as_its_error_and_the_next_parts_run(check, monkeypatch, capsys):
    """A part that fails (here the agreement, as a run too large for the device's memory would) leaves its error
    line in the figures; the attention part after it still runs, and the summary names the failure."""
    def out_of_memory(run, batches, bf16):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 46.1GiB.\n(the details)")

    monkeypatch.setattr(check, "loss_agreement", out_of_memory)
    args = types.SimpleNamespace(only="agreement,attention", budget_s=1e9, steps=1)
    result = check.run_check(args, check.CPU_RUNS, [], 1, 1.0, time.perf_counter(), lambda figures: None)
    assert result["loss_agreement"] == {
        "error": "RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 46.1GiB."}
    assert result["attention"] == ATTENTION and result["unfinished"] == []
    check.print_summary({**result, "device": "cpu", "platform": "cpu", "seconds": 1.0, "tensorflow_imported": False,
                         "memory": {"peak_bytes_in_use": None}})
    printed = capsys.readouterr().out
    assert "loss_agreement failed: RuntimeError: RESOURCE_EXHAUSTED" in printed and "xla 1.00 ms" in printed
