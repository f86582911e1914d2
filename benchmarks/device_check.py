"""The device check: what one GPU does with bert_jax beside HF transformers (PyTorch) on the same GPU, in one run,
from the repository on a machine with no network.

    python benchmarks/device_check.py --out=benchmarks/device_check.json    # one H100/H200: under 8 minutes
    python benchmarks/device_check.py --only=variants,attention --out=...   # some parts only
    python benchmarks/device_check.py --profile=DIR [--run=base] [--set scan_layers=true]   # kernels a step
    python benchmarks/device_check.py --cpu --out=check.json                # the same code path at tiny sizes

Measures, in bfloat16 (float32 master weights), for BERT-base at 256 x 128, BERT-large at 64 x 512 and
ModernBERT-base at 32 x 1024 (its local and global layers) without attention dropout: bert_jax's train step (forward,
backward, AdamW) and its peer, HF's BertForPreTraining (ModernBertForMaskedLM) with
attn_implementation="sdpa" under torch.autocast(bfloat16), fused AdamW and the same gradient clipping and dropout,
eager and under torch.compile, on the same synthetic batches with the same masked positions. The three alternate,
window by window, so that background load hits all of them; the median window gives tokens/s, MFU (model FLOPs of
bert_jax/flops.py over --peak_flops, 989e12 = H100/H200 dense bf16, the same count for both) and the ratios. Also
BERT-base's loss after 50 steps in bfloat16 and in float32 from the same initial state; attention forward + backward
at BERT-large's shapes, and for packed rows and ModernBERT's local window, with each kernel JAX offers; variants of
the step (one switch or XLA flag each, alternating with the BERT-base step: their speed ratio); the device's peak
memory. Parts run in the order of PARTS while --budget_s allows (420 s: the last one started ends within 8 minutes on
an H200), the rest is listed under "skipped". Writes the figures to --out after every part (the parts not yet run
under "unfinished": a run stopped by the device's time limit keeps what it measured), prints them at the end and
ends with one JSON line.
--profile traces a few steps of one run instead (jax.profiler, with a Perfetto trace) and sums the device's kernels a
step by kind and by name.

Nothing is installed and TensorFlow is never imported (the JSON records "tensorflow_imported"): the machine needs
jax, flax, optax, orbax-checkpoint, chex, etils, numpy and tqdm, and torch and transformers for the peer
(--peer=none skips it). ml-collections is pure Python and often missing there; on a machine with network, fetch it
and its requirements once into the repository,

    pip download --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \\
        -d wheels/ ml-collections absl-py PyYAML

and copy wheels/ (under 1 MiB) along with it. This script appends every wheels/*.whl to sys.path, after the installed
packages: an installed copy wins, a missing one imports from its wheel (PyYAML then runs without its C extension).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import functools
import gzip
import importlib.metadata
import json
import math
import os
import pathlib
import re
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
WHEELS = sorted(str(wheel) for wheel in (REPO / "wheels").glob("*.whl"))
sys.path[1:1] = [str(REPO)]  # after this script's folder (benchmarks/, for train_step), before site-packages
sys.path.extend(WHEELS)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# JAX takes 75% of the GPU's memory when it starts; the peer runs in the same process and needs its own share.
# XLA_CLIENT_MEM_FRACTION replaces the deprecated XLA_PYTHON_CLIENT_MEM_FRACTION; jaxlib refuses to start with both.
if not {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"} & os.environ.keys():
    os.environ["XLA_CLIENT_MEM_FRACTION"] = "0.5"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402

from bert_jax import flops  # noqa: E402
from bert_jax.modeling import gpu_attention, transformer  # noqa: E402
from train_step import (benchmark_config, hf_adamw, hf_inputs, hf_model, interleaved_times, jax_step,  # noqa: E402
                        matmul_peak_flops, synthetic_batch)

H100_BF16_PEAK = 989e12
NO_ATTENTION_DROPOUT = ["dtype=bfloat16", "attention_probs_dropout_prob=0"]  # cuDNN attention on both sides
# (model, batch, seq, model switches) of the runs against the peer; --cpu: the tiny presets under the base and
# ModernBERT runs' JSON keys (the large run's code path is the base run's).
ACCELERATOR_RUNS = {"base": ("bert-base", 256, 128, NO_ATTENTION_DROPOUT),
                    "large": ("bert-large", 64, 512, NO_ATTENTION_DROPOUT),
                    "modernbert": ("modernbert-base", 32, 1024, NO_ATTENTION_DROPOUT)}
CPU_RUNS = {"base": ("bert-tiny", 4, 32, NO_ATTENTION_DROPOUT),
            "modernbert": ("modernbert-tiny", 2, 64, NO_ATTENTION_DROPOUT)}
RUN_KEYS = {"base": "bert_base_seq128", "large": "bert_large_seq512", "modernbert": "modernbert_base_seq1024"}
# Variants of BERT-base's step, each timed against it window by window, most telling first (the time budget may end
# the list): (name, model switches, XLA compiler options, what it tests). docs/training.md ("GPU") predicts each.
VARIANTS = [
    ("cublas_gemms", [], {"xla_gpu_enable_triton_gemm": False}, "cuBLAS(Lt) for every GEMM, not autotuned Triton"),
    ("scan_layers", ["scan_layers=true"], {}, "the scanned layer loop: what it keeps, its copies (gpu_compile_check)"),
    ("cudnn_layer_norm", [], {"xla_gpu_enable_cudnn_layer_norm": True}, "LayerNorm's forward as cuDNN kernels"),
    ("attention_dropout", ["attention_probs_dropout_prob=0.1"], {}, "the paper recipe: the reference attention"),
    ("scan_layers+dynamic_slice_fusion", ["scan_layers=true"], {"xla_gpu_enable_dynamic_slice_fusion": True},
     "cuBLAS GEMMs reading the stacked layers in place instead of a copy"),
    ("remat_dots", ["remat_policy=dots"], {}, "recomputing the elementwise ops: less memory traffic, more work"),
]
CPU_VARIANTS = VARIANTS[1:2]  # --cpu: XLA:CPU has no GPU flags; one variant covers the code path
# The parts in the order they run, most needed first.
PARTS = ("base", "agreement", "large", "attention", "modernbert", "variants")
# Where each part's figures go in the JSON.
PART_KEYS = {**RUN_KEYS, "agreement": "loss_agreement", "attention": "attention", "variants": "variants"}


# ------------------------------------------------------------------------------------------------------------------
# bert_jax's step
# ------------------------------------------------------------------------------------------------------------------


def make_batches(config, count: int) -> list[dict]:
    """`count` synthetic batches from a fixed seed: every run in the check sees the same ones."""
    rng = np.random.default_rng(0)
    return [synthetic_batch(config, rng) for _ in range(count)]


def compiled_step(config, batch: dict, compiler_options: dict | None = None):
    """bert_jax's jitted step (train_step.jax_step), compiled with `compiler_options` (XLA flags for this
    executable only), and its initial state."""
    step, state = jax_step(config)
    return step.lower(state, batch).compile(compiler_options=compiler_options or None), state


class JaxRun:
    """bert_jax's step on device-resident batches: first a pass over every batch from the initial state (the
    loss after it compares like with like across runs), then timing windows."""

    def __init__(self, config, batches: list[dict], compiler_options: dict | None = None):
        self.config = config
        self.batches = [jax.device_put(batch) for batch in batches]
        self.step, self.state = compiled_step(config, self.batches[0], compiler_options)
        for batch in self.batches:
            self.state, metrics = self.step(self.state, batch)
        self.first_pass_loss = float(metrics["loss"])

    def window(self, steps: int) -> float:
        """Seconds a step over `steps` steps."""
        start = time.perf_counter()
        for batch in self.batches[:steps]:
            self.state, metrics = self.step(self.state, batch)
        jax.block_until_ready(metrics)
        return (time.perf_counter() - start) / steps


# ------------------------------------------------------------------------------------------------------------------
# The peer: HF transformers
# ------------------------------------------------------------------------------------------------------------------


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class PeerRun:
    """HF's model of the same architecture and head (train_step.hf_model) with sdpa attention, float32 weights under
    bfloat16 autocast, AdamW (fused on CUDA) with the same decay groups, clipping and dropout, on the same batches:
    MLM labels at the same masked positions (-100 elsewhere, so HF's head runs over every position)."""

    def __init__(self, config, batches: list[dict], compile_backend: str | None):
        import torch

        self.device = torch_device()
        model = hf_model(config).to(self.device).train()
        if hasattr(model, "set_attn_implementation"):  # sdpa is transformers 5's default; named where it can be
            model.set_attn_implementation("sdpa")
        self.attention = model.config._attn_implementation  # noqa: SLF001 - what the forward dispatches on
        self.params = list(model.parameters())
        self.optimizer = hf_adamw(model, config, fused=self.device == "cuda")
        self.model = torch.compile(model, backend=compile_backend) if compile_backend else model
        self.batches = [hf_inputs(config, batch, self.device) for batch in batches]
        for batch in self.batches[:2]:  # the first steps compile (torch.compile) or warm up the kernels
            self.step(batch)
        self.synchronize()

    def step(self, batch: dict):
        import torch

        with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
            loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def synchronize(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def window(self, steps: int) -> float:
        start = time.perf_counter()
        for batch in self.batches[:steps]:
            self.step(batch)
        self.synchronize()
        return (time.perf_counter() - start) / steps

    def close(self) -> None:
        """Free the peer's GPU memory for what runs next."""
        import torch

        del self.model, self.optimizer, self.params, self.batches
        if self.device == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------------------
# The parts of the check
# ------------------------------------------------------------------------------------------------------------------


def interleaved(runs: dict, steps: int, rounds: int) -> dict[str, float]:
    """Median seconds a step of each run, timed round by round, one window each in turn."""
    times = interleaved_times({name: functools.partial(run.window, steps) for name, run in runs.items()}, rounds)
    return {name: float(np.median(seconds)) for name, seconds in times.items()}


def compare_with_peer(config, batches: list[dict], args, peak_flops: float) -> tuple[dict, JaxRun]:
    """bert_jax against its eager and compiled peer on the same batches: tokens/s, MFU and the ratios; and bert_jax's
    run, for the variants to time against."""
    runs = {"ours": JaxRun(config, batches)}
    if args.peer == "transformers":
        runs["peer_eager"] = PeerRun(config, batches, compile_backend=None)
        runs["peer_compiled"] = PeerRun(config, batches, compile_backend=args.compile_backend)
    seconds = interleaved(runs, args.steps, args.rounds)
    tokens = config.data.batch_size * config.data.seq_length
    step_flops = flops.train_step_flops(config, gathered_mlm_head=True)
    row = {"batch": config.data.batch_size, "seq": config.data.seq_length, "step_seconds": seconds["ours"],
           "tokens_per_s": tokens / seconds["ours"], "model_flops_per_step": step_flops,
           "mfu": step_flops / seconds["ours"] / peak_flops, "first_pass_loss": runs["ours"].first_pass_loss}
    for name in ("peer_eager", "peer_compiled"):
        if name in runs:
            kind = name.removeprefix("peer_")
            row[f"{name}_tokens_per_s"] = tokens / seconds[name]
            row[f"{name}_mfu"] = step_flops / seconds[name] / peak_flops
            row[f"ratio_vs_{kind}"] = seconds[name] / seconds["ours"]
            row["peer_attention"] = runs[name].attention
            runs[name].close()
    return row, runs["ours"]


def loss_agreement(run: tuple, batches: list[dict], bf16_loss: float) -> dict:
    """The run (model, batch, seq, switches) from the same initial state over the same batches in float32
    (`highest` matmul precision: no TF32 on NVIDIA GPUs) against bfloat16's loss after them."""
    model, batch, seq, switches = run
    with jax.default_matmul_precision("highest"):
        f32 = JaxRun(benchmark_config(model, batch, seq, [s for s in switches if not s.startswith("dtype=")]),
                     batches)
        f32_seconds = f32.window(min(10, len(batches)))
    tokens = f32.config.data.batch_size * f32.config.data.seq_length
    return {"steps": len(batches), "loss_bfloat16": bf16_loss, "loss_float32": f32.first_pass_loss,
            "abs_difference": abs(bf16_loss - f32.first_pass_loss),
            "rel_difference": abs(bf16_loss - f32.first_pass_loss) / abs(f32.first_pass_loss),
            "float32_highest_tokens_per_s": tokens / f32_seconds}


def time_call(fn, *args, trials: int = 10) -> float:
    """Median seconds of fn(*args) after one compiling call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def attention_candidates(packed: bool, half_window: int | None, on_gpu: bool) -> dict:
    """name -> attention(q, k, v, attention_mask, packing) over [B, S, heads, d], for the kernels JAX offers here:
    what bert_jax runs (cuDNN with key lengths; XLA's with the mask, the window or the segments) and the
    alternatives for what cuDNN's public API cannot take (cuDNN with the mask as a bias; Pallas' Triton flash kernel
    with segment ids, interpreted on the CPU)."""
    def mask_of(attention_mask, packing):
        mask = transformer.attention_mask_for(attention_mask, packing)
        return mask if half_window is None else transformer.window_mask(mask, half_window)

    candidates = {
        "xla": lambda q, k, v, m, p: jax.nn.dot_product_attention(q, k, v, mask=mask_of(m, p), implementation="xla"),
        "reference": lambda q, k, v, m, p: nn.dot_product_attention(q, k, v, mask=mask_of(m, p)),
    }
    if not packed:
        candidates["xla_lengths"] = lambda q, k, v, m, p: gpu_attention.attend(
            q, k, v, gpu_attention.key_lengths(m), half_window, implementation="xla")
    if on_gpu:
        candidates["cudnn_bias"] = lambda q, k, v, m, p: jax.nn.dot_product_attention(
            q, k, v, mask=mask_of(m, p), implementation="cudnn")
        if not packed and half_window is None:
            candidates["cudnn_lengths"] = lambda q, k, v, m, p: gpu_attention.attend(
                q, k, v, gpu_attention.key_lengths(m), None)
    if half_window is None:
        candidates["pallas_triton_segments"] = functools.partial(pallas_triton, interpret=not on_gpu)
    return candidates


def pallas_triton(q, k, v, attention_mask, packing, interpret: bool):
    """JAX's example Pallas Triton kernel, with packed rows as segment ids. Imported when called: JAX deprecates the
    module after 0.11, and a release without it makes this one candidate an error row, not the whole run."""
    from jax.experimental.pallas.ops.gpu import attention as triton_attention

    return triton_attention.mha(q, k, v, transformer.segment_ids_for(attention_mask, packing),
                                sm_scale=1.0 / math.sqrt(q.shape[-1]), interpret=interpret)


def forward_and_grads(attend, q, k, v):
    """attend(q, k, v) and the gradients of its sum: one forward and one backward pass."""
    out, pullback = jax.vjp(attend, q, k, v)
    return out, pullback(jnp.ones_like(out))


ATTENTION_CASES = {  # name: (batch, seq, heads, head width, packed, half window); --cpu shrinks them
    "bert_large_padded": (64, 512, 16, 64, False, None),
    "bert_large_packed": (64, 512, 16, 64, True, None),
    "modernbert_base_local": (16, 1024, 12, 64, False, 64),
}


def attention_kernels(on_gpu: bool) -> dict:
    """Forward + backward of each candidate in bfloat16 (ms) and its output's largest difference from the
    reference at the real tokens."""
    results = {}
    for case, (batch, seq, heads, width, packed, half_window) in ATTENTION_CASES.items():
        if not on_gpu:
            batch, seq, heads, width, half_window = 2, 32, 2, 16, half_window and 4
        q, k, v = (jax.random.normal(key, (batch, seq, heads, width), jnp.bfloat16)
                   for key in jax.random.split(jax.random.key(0), 3))
        attention_mask = jnp.ones((batch, seq), jnp.int32).at[1::2, seq * 3 // 4:].set(0)
        packing = jnp.where(jnp.arange(seq) < seq // 3, 1, 2)[None].repeat(batch, 0) * attention_mask \
            if packed else None
        real = np.asarray(attention_mask, bool)
        row = {"shape": [batch, seq, heads, width], "packed": packed, "half_window": half_window}
        reference = None
        for name, attend in attention_candidates(packed, half_window, on_gpu).items():
            forward_backward = jax.jit(lambda q, k, v, attend=attend: forward_and_grads(
                lambda q, k, v: attend(q, k, v, attention_mask, packing), q, k, v))
            try:
                seconds = time_call(forward_backward, q, k, v, trials=10 if on_gpu else 1)
                out = np.asarray(forward_backward(q, k, v)[0], np.float32)
            except Exception as error:  # noqa: BLE001 - a kernel that cannot take the shape is a finding
                row[name] = {"error": str(error).splitlines()[0][:300]}
                continue
            reference = out if name == "xla" else reference
            difference = None if reference is None else float(np.abs(out - reference)[real].max())
            row[name] = {"ms": 1e3 * seconds, "max_abs_difference_vs_xla": difference}
        results[case] = row
    return results


def variants(run: tuple, base: JaxRun, variant_list: list, args, started: float) -> tuple[dict, list[str]]:
    """Each variant of the run's step (model, batch, seq, switches) against `base`, that step itself, window by
    window: step seconds and the speed ratio (above 1: the variant is faster); and those the time budget left out."""
    model, batch, seq, switches = run
    results, skipped = {}, []
    for name, extra, options, purpose in variant_list:
        if time.perf_counter() - started > args.budget_s:
            skipped.append(f"variants/{name}")
            continue
        row = {"purpose": purpose, "switches": extra, "compiler_options": options}
        try:
            variant = JaxRun(benchmark_config(model, batch, seq, switches + extra), base.batches[:args.steps], options)
        except Exception as error:  # noqa: BLE001 - a flag XLA rejects, or a compile that fails, is a finding
            results[name] = {**row, "error": str(error).splitlines()[0][:300]}
            continue
        seconds = interleaved({"base": base, "variant": variant}, args.steps, args.rounds)
        results[name] = {**row, "step_seconds": seconds["variant"], "base_step_seconds": seconds["base"],
                         "speedup": seconds["base"] / seconds["variant"]}
        del variant
    return results, skipped


# ------------------------------------------------------------------------------------------------------------------
# Profiling: kernels a step
# ------------------------------------------------------------------------------------------------------------------

KERNEL_KINDS = (  # the first pattern that a kernel's name matches gives its kind
    ("attention", re.compile(r"cudnn|fmha|flash|sdpa|mha", re.I)),
    ("gemm", re.compile(r"gemm|cublas|cutlass|xmma|nvjet|matmul|dot", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|dynamic_slice|dynamic-slice", re.I)),
    ("reduction", re.compile(r"reduce|input_", re.I)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "elementwise")


def device_kernels(trace_file: pathlib.Path, on_cpu: bool) -> list[tuple[str, float]]:
    """(name, microseconds) of every kernel the device ran in a Perfetto trace written by jax.profiler: the events
    of the /device:* processes (GPU streams); on the CPU, XLA's own threads."""
    events = json.loads(gzip.decompress(trace_file.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")}
    devices = {pid for (pid, tid), name in names.items() if tid is None and name.startswith("/device:")}

    def on_device(event) -> bool:
        if not on_cpu:
            return event["pid"] in devices
        return names.get((event["pid"], event.get("tid")), "").startswith("tf_XLA")

    return [(e["name"], float(e.get("dur", 0))) for e in events if e.get("ph") == "X" and on_device(e)]


def profile(config, steps: int, directory: pathlib.Path) -> dict:
    """Trace `steps` steps of bert_jax's step (after a warm-up) and sum the device's kernels a step."""
    run = JaxRun(config, make_batches(config, steps))
    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        run.window(steps)
    trace_file = max(directory.glob("plugins/profile/*/perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    kernels = device_kernels(trace_file, on_cpu=jax.default_backend() == "cpu")
    by_name, by_kind, launches = collections.Counter(), collections.Counter(), collections.Counter()
    for name, micros in kernels:
        by_name[name] += micros / steps / 1e3
        by_kind[kernel_kind(name)] += micros / steps / 1e3
        launches[kernel_kind(name)] += 1 / steps
    return {"trace": str(trace_file), "steps": steps, "step_seconds": run.window(steps),
            "device_ms_per_step": sum(by_kind.values()), "ms_per_step_by_kind": dict(by_kind.most_common()),
            "launches_per_step_by_kind": dict(launches.most_common()),
            "top_kernels_ms_per_step": dict(by_name.most_common(25))}


# ------------------------------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------------------------------


def run_check(args, runs: dict, variant_list: list, agreement_steps: int, peak: float, started: float,
              save) -> dict:
    """The parts of PARTS asked for (--only), in that order, while the time budget lasts; each part's seconds. After
    each part, `save` gets the figures so far, with the parts still to run as "unfinished": a run that the device's
    time limit stops keeps what it measured. A part that fails (a run that does not fit in memory, a version's
    missing API) is saved as its error line, and the parts after it still run: device time is too scarce to lose
    them to one."""
    result, seconds, skipped, base_run = {}, {}, [], None
    wanted = args.only.split(",") if args.only else PARTS
    unfinished = [part for part in PARTS if part in wanted and not (part in RUN_KEYS and part not in runs)]
    model, batch, seq, switches = runs["base"]
    base_config = benchmark_config(model, batch, seq, switches)
    base_batches = make_batches(base_config, max(agreement_steps, args.steps))
    while unfinished:
        part = unfinished.pop(0)
        if time.perf_counter() - started > args.budget_s:
            skipped.append(part)
            continue
        part_started = time.perf_counter()
        try:
            if part in RUN_KEYS:
                model, batch, seq, switches = runs[part]
                config = base_config if part == "base" else benchmark_config(model, batch, seq, switches)
                batches = base_batches if part == "base" else make_batches(config, args.steps)
                row, ours = compare_with_peer(config, batches, args, peak)
                result[RUN_KEYS[part]] = {"model": model, "switches": switches, **row}
                base_run = ours if part == "base" else base_run
            elif part == "agreement":
                bf16 = result.get(RUN_KEYS["base"], {}).get("first_pass_loss")
                if bf16 is None:
                    bf16 = JaxRun(base_config, base_batches).first_pass_loss
                result["loss_agreement"] = loss_agreement(runs["base"], base_batches, bf16)
            elif part == "attention":
                result["attention"] = attention_kernels(on_gpu=jax.default_backend() == "gpu")
            elif part == "variants":
                base_run = base_run or JaxRun(base_config, base_batches[:args.steps])
                result["variants"], left_out = variants(runs["base"], base_run, variant_list, args, started)
                skipped += left_out
        except Exception as error:  # noqa: BLE001 - a part that fails is a finding; the others still run
            result[PART_KEYS[part]] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
            print(f"{part}: {result[PART_KEYS[part]]['error']}", file=sys.stderr, flush=True)
        seconds[part] = time.perf_counter() - part_started
        save({**result, "part_seconds": seconds, "skipped": skipped, "unfinished": unfinished})
    return {**result, "part_seconds": seconds, "skipped": skipped, "unfinished": unfinished}


def versions() -> dict:
    found = {}
    for package in ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "jax-cuda13-plugin",
                    "jax-cuda12-plugin", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    found["python"] = sys.version.split()[0]
    return found


def floats(tree):
    """Every float in a nested result."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from floats(value)
    elif isinstance(tree, float):
        yield tree


def peak_memory() -> dict:
    """The first device's peak and limit in bytes, as its allocator reports them (None where it reports nothing)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return {"peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit")}


def print_summary(result: dict) -> None:
    print(f"device check on {result['device']} ({result['platform']}), {result['seconds']:.0f} s")
    failed = {key: result[key]["error"] for key in PART_KEYS.values() if "error" in result.get(key, {})}
    result = {key: figures for key, figures in result.items() if key not in failed}
    for key in RUN_KEYS.values():
        if key in result:
            run = result[key]
            peers = "".join(f"; {kind} {run[f'peer_{kind}_tokens_per_s']:,.0f} ({run[f'ratio_vs_{kind}']:.2f}x)"
                            for kind in ("eager", "compiled") if f"ratio_vs_{kind}" in run)
            print(f"  {key:18s} batch {run['batch']:4d}  {run['tokens_per_s']:12,.1f} tokens/s  "
                  f"MFU {100 * run['mfu']:5.1f}%{peers}")
    if "loss_agreement" in result:
        agreement = result["loss_agreement"]
        print(f"  loss after {agreement['steps']} steps: bf16 {agreement['loss_bfloat16']:.4f}  "
              f"f32 {agreement['loss_float32']:.4f}  ({100 * agreement['rel_difference']:.2f}%)")
    for case, row in result.get("attention", {}).items():
        kernels = ", ".join(f"{name} {entry['ms']:.2f} ms" if "ms" in entry else f"{name} failed"
                            for name, entry in row.items() if isinstance(entry, dict))
        print(f"  attention {case} {row['shape']}: {kernels}")
    for name, row in result.get("variants", {}).items():
        print(f"  variant {name}: " + (f"{row['speedup']:.3f}x" if "speedup" in row else f"failed: {row['error']}"))
    for key, error in failed.items():
        print(f"  {key} failed: {error}")
    if result.get("skipped"):
        print(f"  skipped (time budget): {', '.join(result['skipped'])}")
    print(f"  peak device memory {result['memory']['peak_bytes_in_use']} bytes; "
          f"tensorflow imported: {result['tensorflow_imported']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where to write the JSON figures (required unless --profile)")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes and few steps on the CPU (the test)")
    parser.add_argument("--only", default="", help=f"comma-separated parts of {','.join(PARTS)}; default all")
    parser.add_argument("--peer", choices=("transformers", "none"), default="transformers")
    parser.add_argument("--compile_backend", default=None,
                        help="torch.compile's backend for the compiled peer (inductor; eager with --cpu)")
    parser.add_argument("--peak_flops", type=float, default=None,
                        help=f"MFU denominator per device; default {H100_BF16_PEAK:g} (H100/H200 dense bf16), "
                             "with --cpu a measured float32 matmul")
    parser.add_argument("--agreement_steps", type=int, default=None, help="bf16 vs f32 steps (50; 3 with --cpu)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timing window (10; 2 with --cpu)")
    parser.add_argument("--rounds", type=int, default=3, help="timing windows per run; the median counts")
    parser.add_argument("--budget_s", type=float, default=420.0,
                        help="no part starts after this many seconds (what is left is listed as skipped)")
    parser.add_argument("--profile", default=None, metavar="DIR", help="trace --run's step into DIR instead")
    parser.add_argument("--run", choices=sorted(RUN_KEYS), default="base", help="the run --profile traces")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config.model switch for --profile, e.g. --set scan_layers=true")
    args = parser.parse_args()
    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    args.steps = args.steps or (2 if args.cpu else 10)
    args.compile_backend = args.compile_backend or ("eager" if args.cpu else "inductor")
    runs = CPU_RUNS if args.cpu else ACCELERATOR_RUNS
    if args.profile:
        model, batch, seq, switches = runs[args.run]
        row = profile(benchmark_config(model, batch, seq, switches + args.set), args.steps, pathlib.Path(args.profile))
        print(f"{model} {batch} x {seq} {' '.join(switches + args.set)}: {row['device_ms_per_step']:.1f} ms of "
              f"kernels a step ({row['step_seconds'] * 1e3:.1f} ms a step); by kind: "
              + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in row["ms_per_step_by_kind"].items()))
        print(json.dumps(row))
        return
    if not args.out:
        parser.error("--out is required (or --profile)")
    agreement_steps = args.agreement_steps or (3 if args.cpu else 50)
    peak = args.peak_flops or (matmul_peak_flops(with_torch=False) if args.cpu else H100_BF16_PEAK)

    started = time.perf_counter()

    def with_run_facts(figures: dict) -> dict:
        """The figures with what identifies the run: device, date, versions, the time so far, peak memory."""
        full = {**figures, "device": jax.devices()[0].device_kind, "platform": jax.default_backend(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "versions": versions(), "jax_version": jax.__version__, "peak_flops": peak, "memory": peak_memory(),
                "seconds": time.perf_counter() - started,
                "peer_compile_backend": args.compile_backend if args.peer == "transformers" else None,
                "wheels": [pathlib.Path(wheel).name for wheel in WHEELS],
                "tensorflow_imported": "tensorflow" in sys.modules}
        full["all_finite"] = all(math.isfinite(v) for v in floats(full))  # a NaN step or a zero-time window
        return full

    def save(figures: dict) -> dict:
        full = with_run_facts(figures)
        pathlib.Path(args.out).write_text(json.dumps(full, indent=1) + "\n")
        return full

    result = save(run_check(args, runs, CPU_VARIANTS if args.cpu else VARIANTS, agreement_steps, peak, started, save))
    print_summary(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
