"""The device check: what one accelerator does with bert_jax, run from the repository on a machine with no network.

    python benchmarks/device_check.py --out=device_check.json    # one H100/H200: under 10 minutes
    python benchmarks/device_check.py --cpu --out=check.json     # the same code path at tiny sizes (the test runs it)

Measures, with the model in bfloat16: the train step (forward, backward, AdamW) of BERT-base at length 128 and
BERT-large at 512 in tokens/s and MFU (bert_jax/flops.py model FLOPs over --peak_flops, 989e12 = H100/H200 dense
bf16); the loss after 50 steps on the same synthetic batches in bfloat16 and float32, and their difference; JAX's
fused attention (jax.nn.dot_product_attention, what the model runs without attention dropout) against Flax's
reference nn.dot_product_attention (what it runs with it), alone and inside the BERT-large step; and the device's peak
memory. Prints the figures, writes them to --out and ends with one JSON line.

Nothing is installed and TensorFlow is never imported (the JSON records "tensorflow_imported"): the machine needs
jax, flax, optax, orbax-checkpoint, chex, etils, numpy and tqdm. ml-collections is pure Python and often missing
there; on a machine with network, fetch it and its requirements once into the repository,

    pip download --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \\
        -d wheels/ ml-collections absl-py PyYAML

and copy wheels/ (under 1 MiB) along with it. This script appends every wheels/*.whl to sys.path, after the installed
packages: an installed copy wins, a missing one imports from its wheel (PyYAML then runs without its C extension).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
WHEELS = sorted(str(wheel) for wheel in (REPO / "wheels").glob("*.whl"))
sys.path[1:1] = [str(REPO)]  # after this script's folder (benchmarks/, for train_step), before site-packages
sys.path.extend(WHEELS)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from bert_jax import flops  # noqa: E402
from bert_jax.modeling.transformer import dot_product_attention  # noqa: E402
from train_step import benchmark_config, jax_step, matmul_peak_flops, synthetic_batch  # noqa: E402

H100_BF16_PEAK = 989e12
FUSED = ["attention_probs_dropout_prob=0", "attention_impl=auto"]  # no attention dropout: jax.nn's fused kernel
# (model, batch, seq, model switches) of the two runs. --cpu: the tiny preset unrolled, which XLA compiles faster, under
# the same JSON keys (bert_base_seq128 then holds bert-tiny at length 32).
ACCELERATOR_RUNS = {"base": ("bert-base", 256, 128, ["dtype=bfloat16", "scan_layers=true"]),
                    "large": ("bert-large", 64, 512, ["dtype=bfloat16", "scan_layers=true", "remat_policy=dots"])}
CPU_RUNS = {"base": ("bert-tiny", 4, 32, ["dtype=bfloat16"]), "large": ("bert-tiny", 2, 64, ["dtype=bfloat16"])}


def make_batches(config, count: int) -> list[dict]:
    """`count` synthetic batches from a fixed seed: every run in the check sees the same ones."""
    rng = np.random.default_rng(0)
    return [synthetic_batch(config, rng) for _ in range(count)]


def train(config, batches: list[dict], timed_steps: int, rounds: int, peak_flops: float) -> dict:
    """Run every batch once from the initial state (the first step compiles), then time `rounds` windows of
    `timed_steps` steps; the median window gives tokens/s and MFU. Every run starts from the same initial state, so
    first_pass_loss (the loss of the first pass's last step) compares like with like."""
    step, state = jax_step(config)
    for batch in batches:
        state, metrics = step(state, batch)
    first_pass_loss = float(metrics["loss"])
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches[:timed_steps]:
            state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append((time.perf_counter() - start) / timed_steps)
    seconds = float(np.median(times))
    step_flops = flops.train_step_flops(config, gathered_mlm_head=True)
    return {"batch": config.data.batch_size, "seq": config.data.seq_length, "step_seconds": seconds,
            "tokens_per_s": config.data.batch_size * config.data.seq_length / seconds,
            "model_flops_per_step": step_flops, "mfu": step_flops / seconds / peak_flops,
            "first_pass_loss": first_pass_loss}


def time_call(fn, *args, trials: int = 10) -> float:
    """Median seconds of fn(*args) after one compiling call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def attention_kernels(model_config, batch: int, seq: int) -> dict:
    """Forward + backward of one attention call at the model's shapes in bfloat16: the fused kernel the model runs
    without attention dropout against Flax's reference, which materialises the [B, heads, S, S] probabilities."""
    heads = model_config.num_attention_heads
    shape = (batch, seq, heads, model_config.hidden_size // heads)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in jax.random.split(jax.random.key(0), 3))
    mask = jnp.ones((batch, 1, seq, seq), jnp.bool_)
    fused = jax.jit(jax.grad(lambda q, k, v: dot_product_attention(q, k, v, mask, model_config).astype(
        jnp.float32).sum(), argnums=(0, 1, 2)))
    reference = jax.jit(jax.grad(lambda q, k, v: nn.dot_product_attention(q, k, v, mask=mask).astype(
        jnp.float32).sum(), argnums=(0, 1, 2)))
    fused_s, reference_s = time_call(fused, q, k, v), time_call(reference, q, k, v)
    return {"shape": list(shape), "fused_ms": 1e3 * fused_s, "reference_ms": 1e3 * reference_s,
            "speedup": reference_s / fused_s,
            "fused_runs_cudnn": "cudnn" in fused.lower(q, k, v).compile().as_text().lower()}


def peak_memory() -> dict:
    """The first device's peak and limit in bytes, as its allocator reports them (None where it reports nothing)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return {"peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit")}


def run_check(runs: dict, agreement_steps: int, timed_steps: int, rounds: int, peak_flops: float) -> dict:
    """The figures of the two runs in `runs`, base first: its batches also drive the bfloat16-vs-float32 agreement,
    and the large one's shapes the attention comparison."""
    model, batch, seq, switches = runs["base"]
    base = benchmark_config(model, batch, seq, switches)
    batches = make_batches(base, max(agreement_steps, timed_steps))
    result = {"bert_base_seq128": {"model": model, **train(base, batches, timed_steps, rounds, peak_flops)}}
    with jax.default_matmul_precision("highest"):  # the float32 reference: no TF32 matmuls on NVIDIA GPUs
        f32 = train(benchmark_config(model, batch, seq, [s for s in switches if not s.startswith("dtype=")]),
                    batches, timed_steps, rounds, peak_flops)
    bf16_loss, f32_loss = result["bert_base_seq128"]["first_pass_loss"], f32["first_pass_loss"]
    result["loss_agreement"] = {"steps": len(batches), "loss_bfloat16": bf16_loss, "loss_float32": f32_loss,
                                "abs_difference": abs(bf16_loss - f32_loss),
                                "rel_difference": abs(bf16_loss - f32_loss) / abs(f32_loss),
                                "float32_highest_tokens_per_s": f32["tokens_per_s"]}

    model, batch, seq, switches = runs["large"]
    large = benchmark_config(model, batch, seq, switches)
    large_batches = make_batches(large, timed_steps)
    result["bert_large_seq512"] = {"model": model, **train(large, large_batches, timed_steps, rounds, peak_flops)}
    fused = benchmark_config(model, batch, seq, switches + FUSED)
    fused_step = train(fused, large_batches, timed_steps, rounds, peak_flops)
    result["attention"] = {
        "kernel": attention_kernels(fused.model, batch, seq),
        "large_step_fused_tokens_per_s": fused_step["tokens_per_s"], "large_step_fused_mfu": fused_step["mfu"],
        "large_step_reference_tokens_per_s": result["bert_large_seq512"]["tokens_per_s"],
        "large_step_speedup": fused_step["tokens_per_s"] / result["bert_large_seq512"]["tokens_per_s"],
    }
    return result


def floats(tree):
    """Every float in a nested result."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from floats(value)
    elif isinstance(tree, float):
        yield tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write the JSON figures")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes and few steps on the CPU (the test)")
    parser.add_argument("--peak_flops", type=float, default=None,
                        help=f"MFU denominator per device; default {H100_BF16_PEAK:g} (H100/H200 dense bf16), "
                             "with --cpu a measured float32 matmul")
    parser.add_argument("--agreement_steps", type=int, default=None, help="bf16 vs f32 steps (50; 3 with --cpu)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timing window (10; 2 with --cpu)")
    parser.add_argument("--rounds", type=int, default=3, help="timing windows per run; the median counts")
    args = parser.parse_args()
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    agreement_steps = args.agreement_steps or (3 if args.cpu else 50)
    timed_steps = args.steps or (2 if args.cpu else 10)
    peak = args.peak_flops or (matmul_peak_flops(with_torch=False) if args.cpu else H100_BF16_PEAK)

    start = time.perf_counter()
    result = run_check(CPU_RUNS if args.cpu else ACCELERATOR_RUNS, agreement_steps, timed_steps, args.rounds, peak)
    result.update(
        device=jax.devices()[0].device_kind, platform=jax.default_backend(), jax_version=jax.__version__,
        peak_flops=peak, memory=peak_memory(), seconds=time.perf_counter() - start,
        wheels=[pathlib.Path(wheel).name for wheel in WHEELS], tensorflow_imported="tensorflow" in sys.modules)
    result["all_finite"] = all(math.isfinite(v) for v in floats(result))  # a NaN step or a zero-time window

    print(f"device check on {result['device']} ({result['platform']}), {result['seconds']:.0f} s")
    for name in ("bert_base_seq128", "bert_large_seq512"):
        run = result[name]
        print(f"  {name:18s} batch {run['batch']:4d}  {run['tokens_per_s']:10.1f} tokens/s  "
              f"MFU {100 * run['mfu']:5.1f}%")
    agreement = result["loss_agreement"]
    print(f"  loss after {agreement['steps']} steps: bf16 {agreement['loss_bfloat16']:.4f}  "
          f"f32 {agreement['loss_float32']:.4f}  |diff| {agreement['abs_difference']:.2e}")
    attention = result["attention"]
    print(f"  attention fwd+bwd {attention['kernel']['shape']}: fused {attention['kernel']['fused_ms']:.2f} ms, "
          f"reference {attention['kernel']['reference_ms']:.2f} ms; BERT-large step with fused attention "
          f"{attention['large_step_speedup']:.2f}x")
    print(f"  peak device memory {result['memory']['peak_bytes_in_use']} bytes; "
          f"tensorflow imported: {result['tensorflow_imported']}")
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
