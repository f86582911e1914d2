"""benchmarks/device_check.py at tiny sizes on the CPU: the code path an accelerator machine without network runs."""
import json
import math
import os
import pathlib
import subprocess
import sys

from train_helpers import XLA_CACHE_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent
# XLA's CPU compile is most of this test: cheaper passes, and the compiled programs kept for the next run.
FAST_COMPILE = {"XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
                "JAX_COMPILATION_CACHE_DIR": XLA_CACHE_DIR, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}


def test_device_check_cpu_path_writes_finite_figures_without_tensorflow(tmp_path):
    out = tmp_path / "check.json"
    completed = subprocess.run(
        [sys.executable, "benchmarks/device_check.py", "--cpu", f"--out={out}", "--rounds=1"], cwd=REPO,
        env={**os.environ, **FAST_COMPILE, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ""}, capture_output=True,
        text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == result

    assert result["tensorflow_imported"] is False
    assert result["all_finite"] is True
    for run in ("bert_base_seq128", "bert_large_seq512"):
        for key in ("tokens_per_s", "mfu", "model_flops_per_step", "step_seconds"):
            assert math.isfinite(result[run][key]) and result[run][key] > 0, (run, key)
    agreement = result["loss_agreement"]
    assert agreement["steps"] == 3
    assert math.isfinite(agreement["loss_bfloat16"]) and math.isfinite(agreement["loss_float32"])
    assert agreement["abs_difference"] == abs(agreement["loss_bfloat16"] - agreement["loss_float32"])
    assert agreement["rel_difference"] < 1e-2  # bf16 activations drift, but not by a percent in three steps
    attention = result["attention"]
    for value in (attention["kernel"]["fused_ms"], attention["kernel"]["reference_ms"],
                  attention["large_step_fused_tokens_per_s"], attention["large_step_speedup"]):
        assert math.isfinite(value) and value > 0
    assert set(result["memory"]) == {"peak_bytes_in_use", "bytes_limit"}  # None on the CPU, bytes on a GPU
    assert result["platform"] == "cpu" and result["peak_flops"] > 0
