"""Compile the real train step for one NVIDIA GPU on a machine without one: which kernels it launches, where its
copies sit, and how much memory it needs.

    python -m bert_jax.gpu_compile_check --config=configs/bert.py:base --gpu=h200 [--config.key=value ...]

JAX's CUDA plugin (`pip install -e '.[gpu]'`, about 3.6 GB) compiles for a GPU described by a GpuTargetConfig with no
GPU attached, as libtpu does for TPUs (bert_jax.compile_check): the train step that bert_jax.train builds is lowered
for that device and compiled by XLA:GPU. Printed, then one JSON line:
- the kernels one step launches, by kind and counted as often as they run (a loop body once per iteration):
  cuDNN attention, GEMMs (Triton fusions here; on a device the autotuner may pick cuBLAS for some), other fusions,
  plain copies and the memcpys of dynamic slices, in the layer loop and outside it;
- the bytes each kind reads and writes a step, and that traffic over the memory bandwidth: a floor under the
  memory-bound kernels' time (elementwise fusions, copies), not an estimate of it;
- the compiler's memory analysis against the device's memory.
Nothing runs and XLA:GPU gives no cost estimate: times come only from a GPU (benchmarks/device_check.py). With no
device there is no autotuning either, so a GEMM's kernel may differ on the device; attention, fusion and copies
are decided before autotuning.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import re
import time

import ml_collections
from absl import flags

from bert_jax import cli, compile_check, sharding, train
from bert_jax.modeling import transformer
from bert_jax import sharding_audit as audit
from bert_jax.errors import UserError

GB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Gpu:
    """What XLA:GPU needs to know of a device to compile for it (a GpuTargetConfig), from NVIDIA's specifications."""

    description: str  # as the CUDA driver names the device
    cores: int  # streaming multiprocessors
    clock_ghz: float  # boost clock
    memory_bandwidth: float  # bytes/s
    l2_bytes: int
    memory_bytes: int
    peak_flops: float  # dense bfloat16 FLOP/s
    compute_capability: tuple[int, int] = (9, 0)

    def target_config(self) -> str:
        """The GpuTargetConfig text proto (xla/stream_executor/device_description.proto): Hopper's per-SM limits,
        cuDNN 9.10 and CUDA 13, as the `gpu` extra's plugin has them."""
        major, minor = self.compute_capability
        info = (f"threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 "
                f"shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {self.cores} "
                f"fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 "
                f"block_dim_limit_z: 65535 memory_bandwidth: {int(self.memory_bandwidth)} "
                f"l2_cache_size: {self.l2_bytes} clock_rate_ghz: {self.clock_ghz} "
                f"device_memory_size: {self.memory_bytes} shared_memory_per_block_optin: 232448 "
                f"cuda_compute_capability {{ major: {major} minor: {minor} }} registers_per_core_limit: 65536 "
                f"registers_per_block_limit: 65536")
        return (f"gpu_device_info {{ {info} }} platform_name: \"CUDA\" dnn_version_info {{ major: 9 minor: 10 }} "
                f"runtime_version {{ major: 13 minor: 0 }} device_description_str: \"{self.description}\"")


# H100 SXM5 and H200 SXM: the same Hopper die (132 SMs, 50 MB L2, 989 TFLOP/s dense bf16), different memory.
GPUS = {"h100": Gpu("NVIDIA H100 80GB HBM3", 132, 1.98, 3.35e12, 50 * 2 ** 20, 80 * GB, 989e12),
        "h200": Gpu("NVIDIA H200", 132, 1.98, 4.8e12, 50 * 2 ** 20, 141 * 10 ** 9, 989e12)}

# compile_check's settings (JAX on the CPU, libtpu's where the TPU extra is installed too, the CUDA plugin's version
# check skipped), and no GPU to look for.
DEVICELESS_ENVIRONMENT = compile_check.DEVICELESS_ENVIRONMENT + (
    ("CUDA_VISIBLE_DEVICES", ""),  # the CUDA plugin must not look for a GPU
)


class GpuError(UserError, ValueError):
    """A --gpu this check has no description of, or no CUDA plugin to compile with."""


def set_deviceless_environment() -> None:
    """What JAX and the CUDA plugin read when they start: set it before anything starts JAX."""
    compile_check.set_unset_environment(DEVICELESS_ENVIRONMENT)


def gpu_devices(gpu: Gpu) -> list:
    """One compile-only device of that GPU (the plugin's description of it; no GPU needed)."""
    from jax.experimental import topologies

    set_deviceless_environment()
    try:
        return topologies.get_topology_desc(platform="cuda", target_config=gpu.target_config(),
                                            topology="1x1x1").devices
    except RuntimeError as error:
        if "not installed" in str(error) or "Unknown backend" in str(error):
            raise GpuError("compiling for a GPU needs JAX's CUDA plugin: pip install -e '.[gpu]' (it runs on any "
                           "machine)") from None
        raise


def compile_step(config: ml_collections.ConfigDict, gpu: Gpu):
    """The train step as bert_jax.train builds it, lowered with the config's batch and compiled for `gpu`; and the
    seconds that took."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=gpu_devices(gpu))
    train.validate(config, mesh)
    program = train.build_program(config, mesh)
    started = time.perf_counter()
    step = program.step.lower(program.abstract_state, train.abstract_batch(config, mesh)).compile()
    return step, mesh, time.perf_counter() - started


# ------------------------------------------------------------------------------------------------------------------
# The kernels of a compiled XLA:GPU module.
# ------------------------------------------------------------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(")
_RUN_CALLEES = re.compile(r"\b(?:body|condition|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_FUSED = re.compile(r"\bcalls=%([\w.\-]+)")
_BACKEND_KIND = re.compile(r'"kind":"(__[\w$]+)"')
_CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OPERANDS = re.compile(r"%([\w.\-]+)")
NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "conditional", "call",
               "after-all", "partition-id", "replica-id", "opt-barrier"}
GEMM_FUSIONS = {"__triton_gemm", "__triton_nested_gemm_fusion", "__cudnn$fusion", "__cublas"}


def run_computations(module: dict) -> set[str]:
    """Computations whose instructions are launched (the entry, loop bodies and conditions, conditional branches,
    called computations), as opposed to what a fusion or a reduction holds."""
    found, pending = set(), [name for name, (entry, _) in module.items() if entry]
    while pending:
        name = pending.pop()
        if name in found or name not in module:
            continue
        found.add(name)
        for line in module[name][1]:
            pending += _RUN_CALLEES.findall(line)
            pending += [c.strip().lstrip("%") for c in sum((b.split(",") for b in _BRANCHES.findall(line)), [])]
            if " call(" in line or "-start(" in line:
                pending += _FUSED.findall(line)
    return found


def kernel_kind(line: str, op: str, module: dict) -> str:
    """The kind of one launched instruction: cudnn_attention, gemm, slice_copy (a dynamic slice XLA copies out of
    a stacked array, one memcpy), copy, fusion (elementwise, reductions, Triton's softmax and normalisations,
    in-place updates of a stacked array) or the op itself (scatter, sort, rng-bit-generator, collectives...)."""
    if op == "custom-call":
        target = _CUSTOM_TARGET.search(line).group(1)
        if "fmha" in target:
            return "cudnn_attention"
        return "gemm" if "gemm" in target or "matmul" in target else f"custom-call {target}"
    if op in ("copy", "copy-start"):
        return "copy"
    if op != "fusion":
        return op
    backend = _BACKEND_KIND.search(line)
    if backend and (backend.group(1) in GEMM_FUSIONS or "gemm" in backend.group(1)):
        return "gemm"
    if backend and "cudnn" in backend.group(1) and "fmha" in line:
        return "cudnn_attention"
    body = module.get(_FUSED.search(line).group(1), (False, []))[1]
    root = next((x for x in body if x.lstrip().startswith("ROOT ")), "")
    if " copy(" in root and any(" dynamic-slice(" in x for x in body):
        return "slice_copy"
    return "fusion"


def updates_in_place(line: str, module: dict) -> bool:
    """Whether a fusion writes a slice into its first operand's buffer (a dynamic-update-slice at its root): it
    reads and writes the update only, not the whole array its result names."""
    callee = _FUSED.search(line)
    body = module.get(callee.group(1), (False, []))[1] if callee and " fusion(" in line else []
    return any(x.lstrip().startswith("ROOT ") and " dynamic-update-slice(" in x for x in body)


def sliced_parameters(line: str, module: dict) -> dict[int, int]:
    """parameter number -> bytes a fusion reads of it, for the parameters it reads through dynamic slices only (a
    layer's weights or saved activations out of the stacked ones): the slices', not the whole array's."""
    callee = _FUSED.search(line)
    body = module.get(callee.group(1), (False, []))[1] if callee and " fusion(" in line else []
    numbers = {found.group(1): int(number.group(1)) for found, number in
               ((_INSTRUCTION.match(x), re.search(r" parameter\((\d+)\)", x)) for x in body) if found and number}
    sliced = collections.Counter()
    for x in body:
        found = _INSTRUCTION.match(x)
        if found and found.group(3) == "dynamic-slice":
            source = _OPERANDS.findall(x.split("dynamic-slice(", 1)[1])[0]
            if source in numbers:
                sliced[numbers[source]] += audit.array_bytes(found.group(2))
    return sliced


def traffic(line: str, op: str, result: str, types: dict, module: dict) -> tuple[int, int]:
    """(bytes read, bytes written) of one kernel: its operands' arrays (the slices of those it slices) and its
    result's. An approximation (a fusion may read an operand twice) for a floor: bytes over the memory bandwidth."""
    operands = [audit.array_bytes(types.get(name, ""))
                for name in _OPERANDS.findall(line.split(f" {op}(", 1)[1].split(")", 1)[0])]
    if updates_in_place(line, module):
        return sum(operands[1:]), sum(operands[1:])
    for number, size in sliced_parameters(line, module).items():
        operands[number] = size
    return sum(operands), audit.array_bytes(result)


def launched(module: dict):
    """(instruction line, op, result type, times a step, operand types) of every launched instruction."""
    runs = audit.computation_runs(module)
    for name in run_computations(module):
        times = runs(name)
        types = {found.group(1): found.group(2) for found in map(_INSTRUCTION.match, module[name][1]) if found}
        for line in module[name][1]:
            found = _INSTRUCTION.match(line)
            if found and found.group(3) not in NOT_KERNELS:
                yield line, found.group(3), found.group(2), times, types


def kernel_census(hlo_text: str) -> dict:
    """Per step: {kind: {"count", "in_loops", "read_bytes", "write_bytes"}} over the launched instructions
    (kernel_kind), each counted as often as its computation runs; "in_loops" counts those inside while loops (the
    scanned layers, gradient accumulation); the bytes are traffic's approximation."""
    module = audit.computations(hlo_text)
    census = collections.defaultdict(lambda: {"count": 0, "in_loops": 0, "read_bytes": 0, "write_bytes": 0})
    for line, op, result, times, types in launched(module):
        entry = census[kernel_kind(line, op, module)]
        read, written = traffic(line, op, result, types, module)
        entry["count"] += times
        entry["in_loops"] += times if times > 1 else 0
        entry["read_bytes"] += read * times
        entry["write_bytes"] += written * times
    return dict(sorted(census.items(), key=lambda item: -item[1]["count"]))


_OP_NAME = re.compile(r'op_name="([^"]*)"')
SOURCES = (("layer_norm", "norm"), ("dropout", "ropout"), ("activation", "gelu"), ("attention", "attention"),
           ("embeddings", "embeddings"), ("heads", "_head"))


def fusion_traffic_by_source(hlo_text: str) -> dict[str, int]:
    """Bytes the elementwise and reduction fusions read and write a step, by the model part their op names name
    (the optimizer's update: outside the model's jvp; "other": the rest, residual adds and casts among them, and
    what XLA made without an op name, such as the zeros a loop's stacks start from): what fusing LayerNorm, dropout
    or GELU into their neighbours could save."""
    module = audit.computations(hlo_text)
    totals = collections.Counter()
    for line, op, result, times, types in launched(module):
        if kernel_kind(line, op, module) != "fusion":
            continue
        named = _OP_NAME.search(line)
        op_name = named.group(1) if named else ""
        source = next((name for name, word in SOURCES if word in op_name), "other")
        if op_name and "jvp(" not in op_name:
            source = "optimizer"
        totals[source] += sum(traffic(line, op, result, types, module)) * times
    return dict(totals.most_common())


def layer_loop_copies(census: dict, config) -> float:
    """Copies and slice copies a step makes inside loops, per looped layer (per layer and pass for scanned layers):
    the shared encoder's last layer runs after the loop, at the masked positions (transformer.last_layer_at_rows)."""
    inside = sum(census.get(kind, {}).get("in_loops", 0) for kind in ("copy", "slice_copy"))
    return inside / (config.model.num_hidden_layers - transformer.last_layer_at_rows(config.model))


def report(config, gpu: Gpu, compiled, mesh, compile_seconds: float) -> dict:
    """The figures of the module docstring as one JSON-able dict (docs/training.md, "GPU", has them for the presets)."""
    memory = compiled.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
             + memory.temp_size_in_bytes)
    hlo = compiled.as_text()
    census = kernel_census(hlo)
    return {"gpu": gpu.description, "batch": config.data.batch_size, "seq_length": config.data.seq_length,
            "dtype": config.model.dtype, "remat_policy": config.model.remat_policy,
            "scan_layers": config.model.scan_layers, "attention": compile_check.attention_on(mesh, config),
            "compile_s": round(compile_seconds, 1), "fits": total <= gpu.memory_bytes, "memory_gb": total / GB,
            "temp_gb": memory.temp_size_in_bytes / GB, "arguments_gb": memory.argument_size_in_bytes / GB,
            "device_memory_gb": gpu.memory_bytes / GB, "kernels": census,
            "launches": sum(entry["count"] for entry in census.values()),
            "copy_gb": sum(census.get(k, {}).get("write_bytes", 0) for k in ("copy", "slice_copy")) / GB,
            "layer_loop_copies_per_layer": layer_loop_copies(census, config),
            "bandwidth_floor_ms": {kind: 1e3 * (entry["read_bytes"] + entry["write_bytes"]) / gpu.memory_bandwidth
                                   for kind, entry in census.items()},
            "fusion_floor_ms_by_source": {source: 1e3 * size / gpu.memory_bandwidth
                                          for source, size in fusion_traffic_by_source(hlo).items()}}


def print_report(row: dict) -> None:
    print(f"{row['gpu']}: batch {row['batch']} x {row['seq_length']}, {row['dtype']}, remat {row['remat_policy']}, "
          f"scan {row['scan_layers']}, {row['attention']} attention; compiled in {row['compile_s']} s")
    print(f"memory: {row['memory_gb']:.2f} GB of {row['device_memory_gb']:.1f} GB (temporaries "
          f"{row['temp_gb']:.2f} GB, arguments {row['arguments_gb']:.2f} GB); fits: {row['fits']}")
    kinds = ", ".join(f"{kind} {entry['count']} ({entry['in_loops']} in loops)"
                      for kind, entry in row["kernels"].items())
    print(f"kernels a step: {row['launches']} launches: {kinds}")
    print(f"copies: {row['copy_gb']:.2f} GB a step; {row['layer_loop_copies_per_layer']:.1f} per layer inside the "
          "layer loop")
    floors = ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in row["bandwidth_floor_ms"].items())
    print(f"bytes each kind reads and writes over the memory bandwidth (a floor, not a time): {floors}")
    sources = ", ".join(f"{source} {ms:.1f} ms" for source, ms in row["fusion_floor_ms_by_source"].items())
    print(f"the fusions' floor by what they compute: {sources}")


def check(config: ml_collections.ConfigDict, gpu: Gpu) -> dict:
    row = report(config, gpu, *compile_step(config, gpu))
    print_report(row)
    print(json.dumps(row), flush=True)
    return row


def main(argv):
    del argv
    set_deviceless_environment()
    name = flags.FLAGS.gpu.lower()
    if name not in GPUS:
        raise GpuError(f"--gpu={flags.FLAGS.gpu!r}: name one of {', '.join(GPUS)}")
    check(flags.FLAGS.config, GPUS[name])


if __name__ == "__main__":
    flags.DEFINE_string("gpu", "h200", f"The GPU to compile for: {', '.join(GPUS)}.")
    flags.mark_flag_as_required("config")  # --config is bert_jax.train's; so is --workdir, which nothing here writes
    flags.FLAGS.set_default("workdir", "")
    cli.run(main)
