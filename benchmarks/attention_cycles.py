"""Attention's Pallas kernels for TPU, costed by the compiler's own schedule of them (no TPU needed).

    python benchmarks/attention_cycles.py [--rows=72 --heads=16 --seq=512 --width=64] [--half_window=64]

Compiles one layer's attention, forward and backward, for one v5p chip (deviceless, as bert_jax.compile_check does)
with libtpu's LLO dump on, for three kernels: Pallas' splash, and bert_jax's flash kernel
(bert_jax/modeling/flash_attention.py) with attention dropout 0.1 and without (transformer.tpu_kernel picks between
them by these figures). From each
kernel's final VLIW bundles it counts the bundles one TensorCore issues: the grid loop's body times its trip count
(v5p splits a kernel's parallel grid axes over its two cores), plus the bundles outside the loop. That is the
kernel's cycles if nothing stalls: DMA waits and MXU latency the scheduler could not hide are not in it, and a
pl.when region counts on every grid step, so for kernels that meet several tiles (their first-step zeroing and
last-step writes run rarer) it is an upper bound. Beside it: the kernels' matmul FLOPs at the core's peak, which is
what compile_check adds to XLA's estimate for them. Every figure is the compiler's, not a measurement.

libtpu's own static profile (--xla_jf_dump_static_llo_profile_to) would give an estimate with DMA waits, but
libtpu 0.0.42.1 aborts on the masked matmul that the dropout select becomes, so bundles are counted here instead.
Prints a line per kernel, then one JSON line.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = tempfile.mkdtemp(prefix="attention_cycles-")
os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") +
                                  f" --xla_jf_dump_to={DUMP} --xla_jf_dump_llo_text=true").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from bert_jax import compile_check  # noqa: E402

compile_check.set_deviceless_environment("v5p-8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bert_jax.modeling import flash_attention, transformer  # noqa: E402

CLOCK_HZ = compile_check.CHIPS["v5p"].clock_hz  # 459 TFLOP/s a chip = 2 cores x 4 MXUs x 128 x 128 x 2 FLOPs x this
CORE_PEAK = compile_check.CHIPS["v5p"].peak_flops / 2
KERNEL = re.compile(r"(splash_mha|bert_jax_flash)_\w+?\.\d+")


def issue_cycles(bundles_file: str) -> int:
    """Bundles outside the grid loop + the loop body's bundles x its trip count (from its exit test)."""
    lines = [line for line in open(bundles_file) if re.match(r"^\s*0x[0-9a-f]+ ", line)]
    starts = [i for i, line in enumerate(lines) if re.match(r"^\s*0x[0-9a-f]+ LB:", line)]
    if not starts:
        return len(lines)
    exit_test = next(i for i, line in enumerate(lines) if "loop exit test" in line)
    trips = int(re.search(r", (\d+) /\* loop exit test", lines[exit_test]).group(1))
    end = next(i for i in range(exit_test, len(lines)) if "sbr.rel" in lines[i])
    body = end - starts[0] + 1
    return len(lines) - body + body * trips


def layer_attention(kernel: str, args):
    """Gradients of one layer's attention through `kernel`, over q, k, v [rows, S, heads, d] as the layers give
    them: splash takes them heads first, bert_jax's kernel with the heads side by side in the lanes."""
    rate = {"dropout": 0.1, "no_dropout": 0.0}.get(kernel)
    if kernel == "splash":
        from jax.experimental.pallas.ops.tpu import splash_attention as splash

        made = transformer.splash_kernel(args.seq, args.heads, args.half_window, interpret=False)
        attend = lambda q, k, v, ids: jax.vmap(lambda q, k, v, i: made(q, k, v, segment_ids=splash.SegmentIds(i, i)))(
            *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)), ids)
    else:
        lanes = lambda x: x.reshape(*x.shape[:2], -1)
        attend = lambda q, k, v, ids: flash_attention.flash_attention(
            jnp.stack([lanes(q), lanes(k), lanes(v)]), ids, 7, rate, args.heads, args.half_window)
    loss = lambda q, k, v, ids: jnp.sum(attend(q, k, v, ids).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))


def kernel_cycles(kernel: str, args, device) -> dict:
    """{kernel call name: issue cycles on one core} of the compiled forward and backward."""
    for path in glob.glob(f"{DUMP}/*"):
        os.remove(path)
    sharded = jax.sharding.SingleDeviceSharding(device)
    qkv = jax.ShapeDtypeStruct((args.rows, args.seq, args.heads, args.width), jnp.bfloat16, sharding=sharded)
    ids = jax.ShapeDtypeStruct((args.rows, args.seq), jnp.int32, sharding=sharded)
    jax.jit(layer_attention(kernel, args)).lower(qkv, qkv, qkv, ids).compile()
    cycles = {}
    for path in glob.glob(f"{DUMP}/*-final_bundles.txt"):
        name = KERNEL.search(os.path.basename(path))
        if name:
            cycles[name.group(0)] = issue_cycles(path)
    return cycles


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=72, help="batch rows a chip (BERT-large s512 on v5p-8: 72)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--width", type=int, default=64, help="head width d")
    parser.add_argument("--half_window", type=int, default=None, help="a local window's reach (ModernBERT: 64)")
    args = parser.parse_args()
    device = compile_check.topology_devices(compile_check.parse_topology("v5p-8"))[0]
    tiling = flash_attention.pick_tiling(args.seq, args.heads, args.width, args.half_window)
    flops = 4 * args.rows * args.heads * tiling.pairs() * tiling.block_q * tiling.block_k * args.width * (1 + 5 / 2)
    at_peak = flops / 2 / CORE_PEAK * CLOCK_HZ  # a core's share of the fused kernels' matmuls at its peak
    print(f"{args.rows} rows x {args.heads} heads x {args.seq} tokens x {args.width}, half window {args.half_window}: "
          f"matmuls at a core's peak (what compile_check assumes) {at_peak / 1e6:.3f}M cycles a core")
    figures = {"shape": vars(args), "matmuls_at_peak_cycles": at_peak}
    try:
        for kernel in ("splash", "dropout", "no_dropout"):
            cycles = kernel_cycles(kernel, args, device)
            total = sum(cycles.values())
            figures[kernel] = {"cycles": cycles, "total_cycles": total, "ms": total / CLOCK_HZ * 1e3,
                               "x_matmuls_at_peak": total / at_peak}
            print(f"{kernel}: {total / 1e6:.3f}M cycles a core ({total / CLOCK_HZ * 1e3:.3f} ms, "
                  f"{total / at_peak:.2f}x the matmuls at peak): "
                  + ", ".join(f"{name} {count / 1e6:.3f}M" for name, count in sorted(cycles.items())), flush=True)
    finally:
        shutil.rmtree(DUMP, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
