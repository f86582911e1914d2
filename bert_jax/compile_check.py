"""Compile the real train step for a TPU pod slice on a machine without one: does it fit, and how fast does the
compiler expect it to run?

    python -m bert_jax.compile_check --config=configs/bert.py:large --topology=v5p-8 [--num_slices=2] \\
        [--config.key=value ...]

libtpu (`pip install -e '.[tpu]'`) compiles for a named topology with no TPU attached (deviceless ahead-of-time
compilation): the mesh is built over the topology's devices, and `train.build_program`'s train and evaluation steps
are lowered with the config's batch, dtype, remat, scan and attention and compiled by XLA:TPU. Per chip it prints
the state and the temporaries against the chip's HBM, the step's FLOPs, the compiler's estimated step time, MFU
(model FLOPs of bert_jax.flops over that time x the chip's peak), the collectives against the layout's ideal
(bert_jax.sharding_audit) and the days that config.total_steps would take, then one JSON line. A step that does not
fit ends with one line naming the overshoot and the knobs that shrink it, and exit code 1. Nothing runs: every
time and MFU here is the compiler's cost model, not a measurement (benchmarks/device_check.py measures a device).

Topologies are named as Cloud TPU names slices: v4-N and v5p-N count TensorCores (v5p-8 is 4 chips), v5e-N and
v6e-N count chips; `v5p:4x4x8` names the chip grid itself. --num_slices compiles for a multislice job, data
parallelism spanning the slices.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time

import jax
import ml_collections
import numpy as np
from absl import flags

from bert_jax import cli, families, flops, sharding, train
from bert_jax import sharding_audit as audit
from bert_jax.errors import UserError
from bert_jax.config_lib import generator_config
from bert_jax.modeling.transformer import (attention_kernel, splash_block, splash_fused_backward, splash_tiles,
                                           tpu_kernel)

GB = 2 ** 30  # as Cloud TPU's specifications and XLA count memory


class TopologyError(UserError, ValueError):
    """A --topology that names no TPU slice this check knows; the message lists the forms it takes."""


class DoesNotFit(UserError):
    """The step needs more HBM per chip than the chip has; the message names the overshoot and the knobs."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation, as Cloud TPU's published specifications give it per chip."""

    hbm_gib: float  # as published (the topology table of docs/tpu.md)
    hbm_gb: float  # what XLA:TPU lets a program use, as its refusals say (libtpu 0.0.42.1): the fit is against it
    peak_flops: float  # dense bfloat16 FLOP/s
    clock_hz: float  # the peak over the MXUs' FLOPs a cycle: turns the compiler's per-instruction cycles into time
    torus_dims: int  # v4 and v5p: an X x Y x Z torus of chips; v5e and v6e: X x Y
    name_counts_cores: bool  # v4-N and v5p-N count TensorCores (two a chip); v5e-N and v6e-N count chips
    chip_config: str = "default"  # how libtpu presents a chip: v4's two TensorCores as one device is "megacore"


CHIPS = {"v4": Chip(32, 30.75, 275e12, 1.05e9, 3, True, "megacore"), "v5p": Chip(95, 95.74, 459e12, 1.75e9, 3, True),
         "v5e": Chip(16, 15.75, 197e12, 1.5e9, 2, False), "v6e": Chip(32, 31.25, 918e12, 1.75e9, 2, False)}
_SLICE = re.compile(r"^(v4|v5p|v5e|v6e)-(\d+)$")
_GRID = re.compile(r"^(v4|v5p|v5e|v6e):(\d+(?:x\d+)+)$")


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    generation: str
    grid: tuple[int, ...]  # chips along each axis of one slice's torus
    num_slices: int = 1

    @property
    def chip(self) -> Chip:
        return CHIPS[self.generation]

    @property
    def chips(self) -> int:
        """Chips of every slice together: the devices of the mesh."""
        return math.prod(self.grid) * self.num_slices

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        """Chips per host along the grid: four (2 x 2), or the whole slice up to 8 chips of v5e and v6e."""
        grid = (*self.grid, 1)[:3]
        if self.chip.torus_dims == 2 and math.prod(grid) <= 8:
            return grid
        return (min(2, grid[0]), min(2, grid[1]), 1)

    @property
    def hosts(self) -> int:
        return self.chips // math.prod(self.host_bounds)


def torus_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The grid Cloud TPU gives a power-of-two slice: double the shortest axis until it holds `chips`, shortest axis
    first, unused axes last (4 chips of v5p: 2x2x1; 16: 2x2x4; 8 of v5e: 2x4)."""
    grid = [1] * dims
    while math.prod(grid) < chips:
        grid[grid.index(min(grid))] *= 2
    return tuple(sorted(grid, key=lambda d: (d == 1, d)))


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """A --topology value: `v5p-128` (Cloud TPU's slice name) or `v5p:4x4x4` (the chip grid)."""
    forms = "v4-N, v5p-N (N TensorCores: v5p-8 is 4 chips), v5e-N, v6e-N (N chips), or v5p:4x4x8 (the chip grid)"
    if num_slices < 1:
        raise TopologyError(f"--num_slices={num_slices}: must be >= 1")
    grid_form = _GRID.match(name)
    if grid_form:
        generation, grid = grid_form.group(1), tuple(int(d) for d in grid_form.group(2).split("x"))
        if len(grid) != CHIPS[generation].torus_dims or min(grid) < 1:
            raise TopologyError(f"--topology={name}: {generation} slices are {CHIPS[generation].torus_dims}-D grids")
        return Topology(name, generation, grid, num_slices)
    slice_form = _SLICE.match(name)
    if not slice_form:
        raise TopologyError(f"--topology={name!r}: name a TPU slice as {forms}")
    generation, count = slice_form.group(1), int(slice_form.group(2))
    chip = CHIPS[generation]
    chips = count // 2 if chip.name_counts_cores else count
    if chips < 1 or chips & (chips - 1) or (chip.name_counts_cores and count % 2):
        raise TopologyError(f"--topology={name}: {count} is not a power-of-two slice; name its grid instead "
                            f"({generation}:{'x'.join(['4'] * chip.torus_dims)} and the like)")
    return Topology(name, generation, torus_grid(chips, chip.torus_dims), num_slices)


DEVICELESS_ENVIRONMENT = (
    ("JAX_PLATFORMS", "cpu"),  # JAX itself stays on the CPU: nothing runs, and it must not look for a TPU either
    ("TPU_SKIP_MDS_QUERY", "1"),  # no metadata server to ask (there may be no network)
    ("TPU_WORKER_HOSTNAMES", "localhost"),  # this host is the only worker
    ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),  # compiling holds no TPU, so several processes may compile at once
    ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1"),  # where the `gpu` extra is installed too: no CUDA to check here
)


def set_unset_environment(settings: tuple[tuple[str, str], ...]) -> None:
    """Each variable of `settings` the user has not set, and JAX_PLATFORMS's value in JAX's config too: JAX read it
    when it was imported, before a command's flags were parsed, and would otherwise start every installed backend
    (libtpu's then searches for a TPU and logs errors)."""
    for key, value in settings:
        os.environ.setdefault(key, value)
    jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])


def set_deviceless_environment(topology_name: str = "") -> None:
    """What JAX and libtpu read when they start, for compiling with no TPU (DEVICELESS_ENVIRONMENT), and the slice
    as TPU_ACCELERATOR_TYPE, and the flags a TPU run gives libtpu (cli.TPU_COMPILER_FLAGS): set it before anything
    starts JAX, whose start already reads it."""
    cli.use_tpu_compiler_flags()
    set_unset_environment(DEVICELESS_ENVIRONMENT)
    if _SLICE.match(topology_name):
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", topology_name)


def topology_devices(topology: Topology) -> list:
    """The compile-only devices of every chip of the topology (libtpu's description of it; no TPU needed)."""
    from jax.experimental import topologies

    set_deviceless_environment(topology.name)
    try:
        description = topologies.get_topology_desc(
            platform="tpu", topology_name=f"{topology.generation}:{'x'.join(map(str, topology.grid))}",
            chip_config_name=topology.chip.chip_config, chips_per_host_bounds=topology.host_bounds,
            num_slices=topology.num_slices)
    except RuntimeError as error:
        if "not installed" in str(error):
            raise TopologyError("compiling for TPU needs libtpu: pip install -e '.[tpu]' (it runs on any machine)") \
                from None
        raise
    return description.devices


# ------------------------------------------------------------------------------------------------------------------
# Compile, then read the executable.
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Compiled:
    """What compiling the step for a topology gave: the executables, or the compiler's out-of-memory figures."""

    config: ml_collections.ConfigDict
    topology: Topology
    mesh: object
    program: train.Program
    step: object | None  # jax.stages.Compiled of the train step; None when it did not fit
    evaluate: object | None
    compile_seconds: float
    out_of_memory: dict | None = None  # {"needed_gb", "hbm_gb", "message"} from the compiler's refusal


def compile_program(config: ml_collections.ConfigDict, topology: Topology, with_eval: bool = True) -> Compiled:
    """Lower and compile the train step (and the evaluation step) exactly as bert_jax.train builds them, on a mesh
    over the topology's devices; the compiler's own out-of-memory refusal is kept, not raised."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                              devices=topology_devices(topology))
    train.validate(config, mesh)
    program = train.build_program(config, mesh)
    batch = train.abstract_batch(config, mesh)
    started = time.perf_counter()
    try:
        step = program.step.lower(program.abstract_state, batch).compile()
        evaluate = program.evaluate.lower(program.abstract_state["params"], batch).compile() if with_eval else None
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return Compiled(config, topology, mesh, program, None, None, time.perf_counter() - started,
                        out_of_memory_figures(str(error)))
    return Compiled(config, topology, mesh, program, step, evaluate, time.perf_counter() - started)


def out_of_memory_figures(message: str) -> dict:
    """XLA:TPU's refusal in GB, in any unit it prints: "the total memory required for HLO temporaries (1.33T)
    exceeds available HBM (95.74G)" gives the temporaries ("temp_gb"), "Used 1.02T of 95.74G hbm" the whole need
    ("needed_gb"); both give the HBM the compiler lets a program use ("hbm_gb")."""
    figures = {"message": message.splitlines()[0][:400]}
    scale = {"T": 2 ** 40, "G": GB, "M": 2 ** 20, "K": 2 ** 10}
    for key, pattern in (("temp_gb", r"\(([\d.]+)([TGMK])\) exceeds available HBM \(([\d.]+)([TGMK])\)"),
                         ("needed_gb", r"Used ([\d.]+)([TGMK]) of ([\d.]+)([TGMK]) hbm")):
        found = re.search(pattern, message)
        if found:
            figures[key] = float(found.group(1)) * scale[found.group(2)] / GB
            figures["hbm_gb"] = float(found.group(3)) * scale[found.group(4)] / GB
            break
    return figures


def state_bytes_per_chip(abstract_state) -> int:
    """Bytes of parameters and optimizer state one chip holds under the state's shardings."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
               for leaf in jax.tree.leaves(abstract_state))


def report(compiled: Compiled) -> dict:
    """The figures of the module docstring, per chip, as one JSON-able dict (keys documented in docs/tpu.md)."""
    config, topology, chip = compiled.config, compiled.topology, compiled.topology.chip
    hbm = chip.hbm_gb * GB
    base = {"topology": topology.name, "num_slices": topology.num_slices, "chips": topology.chips,
            "hosts": topology.hosts, "mesh": dict(compiled.mesh.shape), "batch": config.data.batch_size,
            "batch_per_chip": config.data.batch_size / topology.chips, "seq_length": config.data.seq_length,
            "dtype": config.model.dtype, "remat_policy": config.model.remat_policy,
            "scan_layers": config.model.scan_layers, "attention": attention_on(compiled.mesh, config),
            "hbm_gb": hbm / GB, "compile_s": round(compiled.compile_seconds, 1),
            "libtpu_flags": os.environ.get("LIBTPU_INIT_ARGS", ""),
            "state_gb": state_bytes_per_chip(compiled.program.abstract_state) / GB}
    if compiled.step is None:
        return {**base, **refused_memory(compiled.out_of_memory, base["state_gb"]), "fits": False,
                "compiler_says": compiled.out_of_memory["message"]}
    memory = compiled.step.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
             + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
    cost = compiled.step.cost_analysis()
    hlo = compiled.step.as_text()
    kernel_flops = splash_flops(hlo, config, compiled.mesh)
    compiler_seconds, hlo_flops, factor, cycle_seconds = compiler_cost(hlo, cost, chip)
    method = "as compiled" if factor == 1 else f"while-loop bodies counted per iteration (x{factor:.2f})"
    model_flops = flops.train_step_flops(config) / topology.chips
    timing = step_estimates(config, topology, compiler_seconds, kernel_flops, model_flops, cycle_seconds)
    stats = audit.collective_stats(hlo)
    ideal = audit.ideal_bytes(config, compiled.mesh, compiled.program.state_shardings["params"],
                              compiled.program.abstract_state["params"])
    return {**base, "fits": total <= hbm, "per_chip_gb": total / GB, "temp_gb": memory.temp_size_in_bytes / GB,
            "arguments_gb": memory.argument_size_in_bytes / GB, "hlo_flops": hlo_flops, "splash_flops": kernel_flops,
            "model_flops": model_flops, "compiler_step_s": compiler_seconds, "loop_factor": factor,
            "estimate": method if timing["est_step_s"] else f"none: XLA:TPU's cost model gave {compiler_seconds:.3g} s",
            **timing, "total_steps": config.total_steps,
            "collectives": {kind: entry for kind, entry in stats.items() if entry["count"]},
            "collective_gb": audit.total_bytes(stats) / GB, "ideal_gb": sum(ideal.values()) / GB,
            "collective_wire_gb": audit.wire_bytes(stats) / GB,
            "ideal_wire_gb": audit.ideal_wire_bytes(config, ideal) / GB,
            "donated": audit.donated_inputs(hlo) == len(jax.tree.leaves(compiled.program.abstract_state)),
            "cycle_shares": cycle_shares(hlo),
            "eval_compiled": compiled.evaluate is not None}


def refused_memory(figures: dict, state_gb: float) -> dict:
    """Per-chip memory of a step the compiler refused, from its figures: the whole need and the temporaries (the
    part that scales with the batch), each from the other and the state where the refusal names only one."""
    memory = {"hbm_gb": figures["hbm_gb"]} if "hbm_gb" in figures else {}
    if "temp_gb" in figures:
        return {**memory, "temp_gb": figures["temp_gb"], "per_chip_gb": figures["temp_gb"] + state_gb}
    if "needed_gb" in figures:
        return {**memory, "temp_gb": figures["needed_gb"] - state_gb, "per_chip_gb": figures["needed_gb"]}
    return {**memory, "temp_gb": None, "per_chip_gb": None}


HBM_MARGIN = 0.92  # of the chip's HBM a predicted batch aims at: the temporaries do not grow exactly linearly


def predicted_largest_batch(row: dict) -> int:
    """The batch per chip that fills HBM_MARGIN of the chip by a compiled (or refused) row's memory, taken as fixed
    (state) + per-example (the temporaries, which scale with the batch); a multiple of 8 from 16 on, 0 when not
    even one example is predicted to fit."""
    fixed = row["per_chip_gb"] - row["temp_gb"]
    per_example = row["temp_gb"] / row["batch_per_chip"]
    predicted = max(0, int((HBM_MARGIN * row["hbm_gb"] - fixed) / per_example))
    return predicted // 8 * 8 if predicted >= 16 else predicted


FLOPS_FLOOR = "the model's FLOPs at peak"  # what an estimate is where it was floored (step_estimates' est_floored)


def step_estimates(config, topology: Topology, compiler_seconds: float, kernel_flops: float,
                   model_flops: float, cycle_seconds: float) -> dict:
    """The estimated step time (the compiler's plus the splash kernels' FLOPs at peak) and what follows from it:
    MFU, tokens per second a chip, days for config.total_steps, the kernels' share; beside it the step at the sum
    of the compiler's per-instruction cycles (the slow end of the range; the MFU is the first's). All None where
    the compiler's own time is not positive: without a TPU, libtpu 0.0.42.1's cost model returns negative seconds
    for every step compiled for v4, v5e or v6e (v5p's are positive).

    No step runs its model's FLOPs faster than the chip's peak, but a loop's `optimal_seconds` is scaled, not counted
    (compiler_cost), and can come out below that (ELECTRA-large scanned at 208 a chip: 477 ms against 499 ms of FLOPs
    at peak, est. MFU 1.05): the estimate is then that floor, and "est_floored" says so."""
    peak = topology.chip.peak_flops
    if compiler_seconds <= 0:
        return dict.fromkeys(("est_step_s", "est_mfu", "est_tokens_per_s_per_chip", "est_days", "splash_share",
                              "est_step_cycles_s", "est_mfu_cycles", "est_floored"))
    floor = model_flops / peak
    step_seconds = max(compiler_seconds + kernel_flops / peak, floor)
    cycles_step = cycle_seconds + kernel_flops / peak
    return {"est_step_s": step_seconds, "est_floored": step_seconds == floor,
            "est_mfu": model_flops / (step_seconds * peak),
            "est_tokens_per_s_per_chip": config.data.batch_size * config.data.seq_length / topology.chips
            / step_seconds,
            "est_days": config.total_steps * step_seconds / 86400, "splash_share": kernel_flops / peak / step_seconds,
            "est_step_cycles_s": cycles_step, "est_mfu_cycles": model_flops / (cycles_step * peak)}


_SPLASH_CALL = re.compile(r"^\s*(?:ROOT )?%(splash_mha|bert_jax_flash)_(fwd|dkv|dq|bwd)\w*(?:\.\d+)? = ")


def layer_attention(model: ml_collections.ConfigDict) -> list[tuple[int | None, str]]:
    """Each layer's attention half window (None: global attention) and the Pallas kernel that attention_impl=splash
    runs it in when training (transformer.tpu_kernel), as the family's layers attend."""
    family = families.of(model)
    dropout = model.attention_probs_dropout_prob > 0.0
    windows = [family.attention_half_window(model, layer) if family.attention_half_window else None
               for layer in range(model.num_hidden_layers)]
    return [(window, tpu_kernel(window, dropout, family.stacked_qkv)) for window in windows]


def splash_flops(hlo_text: str, config, mesh) -> float:
    """FLOPs per chip and step of the splash kernels the step calls, which XLA's cost model cannot see into (it
    costs a Pallas call by its operands alone): the tiles each layer computes, 2 matmuls a tile forward and in the
    backward 5 (fused) or 4 + 3 (splash_fused_backward), times the forward passes the HLO makes a layer (a
    rematerialised forward counts again). Where bert_jax's flash kernel runs instead (bert_jax_flash_*,
    transformer.tpu_kernel), it computes the same tiles and always fuses its backward."""
    module = audit.computations(hlo_text)
    runs = audit.computation_runs(module)
    calls = {"fwd": 0, "dkv": 0, "dq": 0}
    for name, (_, lines) in module.items():
        for line in lines:
            call = _SPLASH_CALL.match(line)
            if call:
                calls[{"bwd": "dkv"}.get(call.group(2), call.group(2))] += runs(name)
    if not any(calls.values()):
        return 0.0
    encoders = [config.model] + ([generator_config(config.model)] if config.objective == "rtd" else [])
    rows = config.data.batch_size // config.optimizer.grad_accum_steps // (mesh.shape["data"] * mesh.shape["fsdp"])
    seq = config.data.seq_length
    layers = sum(model.num_hidden_layers for model in encoders)
    forward_runs, backward = calls["fwd"] / layers, calls["dkv"] > 0
    total = 0.0
    for model in encoders:
        heads, width = model.num_attention_heads // mesh.shape["tensor"], model.hidden_size // model.num_attention_heads
        for window, kernel in layer_attention(model):
            forward_pass = 4 * rows * heads * splash_tiles(seq, window) * splash_block(seq, window) ** 2 * width
            fused = kernel == "flash" or splash_fused_backward(seq, window)
            backward_matmuls = 5 if fused else 4 + 3
            total += forward_pass * (forward_runs + backward * backward_matmuls / 2)
    return total


_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def cycle_lines(hlo_text: str):
    """(line, its compiler-estimated cycles, the times it runs a step, whether it is a matmul) for every instruction
    that carries an estimate: a while body's run as often as its loop's trip count (audit.computation_runs)."""
    module = audit.computations(hlo_text)
    runs = audit.computation_runs(module)
    matmul_computations = {name for name, (_, lines) in module.items() if any(" convolution(" in x for x in lines)}
    for name, (_, lines) in module.items():
        for line in lines:
            cycles = _CYCLES.search(line)
            if cycles:
                callee = re.search(r"calls=%([\w.\-]+)", line)
                matmul = "kind=kOutput" in line or bool(callee and callee.group(1) in matmul_computations)
                yield line, int(cycles.group(1)), runs(name), matmul


def compiler_cost(hlo_text: str, cost: dict, chip: Chip) -> tuple[float, float, float, float]:
    """(the compiler's step seconds, HLO FLOPs, the loops' factor on them, the step at its cycle sum). XLA's cost
    analysis costs a while body once, not once per iteration, so a step with scanned layers (or gradient
    accumulation) would look up to L times faster than it runs: its seconds are scaled by the per-instruction cycles
    counted as the step runs them (a body times its trip count) over the same counted once, its FLOPs by the
    matmuls' cycles so."""
    every = once = matmul_every = matmul_once = 0
    for _, cycles, runs, matmul in cycle_lines(hlo_text):
        every, once = every + cycles * runs, once + cycles
        if matmul:
            matmul_every, matmul_once = matmul_every + cycles * runs, matmul_once + cycles
    factor = every / once if once else 1.0
    flops_factor = matmul_every / matmul_once if matmul_once else factor
    return cost["optimal_seconds"] * factor, cost.get("flops", 0.0) * flops_factor, factor, every / chip.clock_hz


def cycle_shares(hlo_text: str) -> dict[str, float]:
    """Where the compiler's per-instruction cycle estimates go, as shares: matmuls (convolution fusions), LayerNorms,
    dropout, the optimizer update (outside the model's forward and backward), and everything else elementwise
    (softmax, activations, casts, copies), whose three largest sources (op names, layer numbers dropped) follow as
    "other: <name>". Pallas kernels and asynchronous collectives carry no estimate."""
    totals = dict.fromkeys(("matmuls", "layer_norms", "dropout", "optimizer", "other_elementwise"), 0)
    others = {}
    for line, cycles, runs, matmul in cycle_lines(hlo_text):
        count = cycles * runs
        named = _OP_NAME.search(line)
        op_name = named.group(1) if named else ""
        if matmul:
            kind = "matmuls"
        elif "norm" in op_name:
            kind = "layer_norms"
        elif "ropout" in op_name:
            kind = "dropout"  # its random bits (threefry) as well as the masking
        elif not re.search(r"jvp\([\w.]+\)", op_name):  # the model's ops: jvp(<module>) or jvp(<module.method>)
            kind = "optimizer"
        else:
            kind = "other_elementwise"
            source = re.sub(r"layer_\d+", "layer_N", op_name.split(")/", 1)[-1])
            others[source] = others.get(source, 0) + count
        totals[kind] += count
    whole = sum(totals.values()) or 1
    top = sorted(others.items(), key=lambda item: -item[1])[:3]
    return {**{kind: cycles / whole for kind, cycles in totals.items()},
            **{f"other: {source}": cycles / whole for source, cycles in top}}


def attention_on(mesh, config) -> str:
    """The attention kernel the train step runs on `mesh` (attention_kernel, as the step is traced for it)."""
    with sharding.activation_sharding(mesh):
        return attention_kernel(config.model, deterministic=False, seq_length=config.data.seq_length)


def overshoot_message(row: dict, config) -> str:
    """The one line for a step that does not fit: the overshoot in GB against the compiler's HBM, and only the knobs
    that shrink this config's memory (scan_advice)."""
    fits = predicted_largest_batch(row) if row.get("temp_gb") else 0
    knobs = [f"config.data.batch_size={fits * row['chips']} ({fits} a chip, what its memory per example fits; now "
             f"{row['batch_per_chip']:g})" if fits else
             f"a smaller config.data.batch_size (now {row['batch_per_chip']:g} a chip)"]
    if config.model.remat_policy == "none":
        knobs.append("config.model.remat_policy=dots or full (recompute activations in the backward pass)")
    if not config.model.scan_layers and (why := scan_advice(config.model)):
        knobs.append(f"config.model.scan_layers=true ({why})")
    if config.mesh.fsdp == 1 and row["chips"] > 1 and row["per_chip_gb"] and row["state_gb"] > row["per_chip_gb"] / 2:
        knobs.append(f"config.mesh.fsdp=-1 (parameters and optimizer state, {row['state_gb']:.1f} GB, split over "
                     f"the chips)")
    needed = (f"{row['per_chip_gb']:.1f} GB, {row['per_chip_gb'] - row['hbm_gb']:.1f} GB more than the "
              f"{row['hbm_gb']:.2f} GB" if row.get("per_chip_gb") else f"more than the {row['hbm_gb']:.2f} GB")
    return (f"does not fit: the step needs {needed} of HBM the compiler allows a chip on {row['topology']}; "
            f"try {'; '.join(knobs)}")


def scan_advice(model_config) -> str:
    """Why scanned layers would shrink this model's step, or "" where they would not. With remat, the loop holds one
    layer's saved activations at a time. Without, where each layer has weights of its own, it keeps only the named
    activations (transformer.SCANNED_SAVES): BERT-base s128 at 256 a chip on v5p-8 takes 9.7 GB scanned against
    10.5, BERT-large s512 at 72 25.5 against 29.4 (docs/tpu.md). ALBERT's shared layer scanned without remat holds
    more (ALBERT-xxlarge s512 at 24 a chip: 16.7 against 15.1 GB)."""
    if not families.of(model_config).scans_layers:
        return ""
    if model_config.remat_policy != "none":
        return "with remat, one layer's saved activations at a time"
    if model_config.num_hidden_groups == model_config.num_hidden_layers:
        return "the layer loop keeps only its named activations"
    return ""


def print_report(row: dict) -> None:
    """The figures for a person, per chip; every time and MFU labelled as the compiler's estimate."""
    print(f"{row['topology']} x{row['num_slices']} slice(s): {row['chips']} chips on {row['hosts']} hosts, mesh "
          f"{row['mesh']}; batch {row['batch']} x {row['seq_length']} ({row['batch_per_chip']:g} a chip), "
          f"{row['dtype']}, remat {row['remat_policy']}, scan {row['scan_layers']}, {row['attention']} attention; "
          f"compiled in {row['compile_s']} s")
    if "compiler_says" in row:
        print(f"memory per chip: does not fit ({row['compiler_says']})")
        return
    print(f"memory per chip: parameters + optimizer state {row['state_gb']:.2f} GB, temporaries (activations) "
          f"{row['temp_gb']:.2f} GB, total {row['per_chip_gb']:.2f} GB of {row['hbm_gb']:.1f} GB HBM")
    timing = "no step time (the compiler's cost model gave none for this chip)"
    if row["est_step_s"]:
        source = (f"{FLOPS_FLOOR}, above the cost model's optimal_seconds" if row.get("est_floored")
                  else "the cost model's optimal_seconds")
        timing = (f"step {row['est_step_s'] * 1e3:.1f} ms ({source}; "
                  f"{row['est_step_cycles_s'] * 1e3:.1f} ms at its per-instruction cycle sum), "
                  f"MFU {row['est_mfu']:.2f} ({row['est_mfu_cycles']:.2f} at the cycle sum), "
                  f"{row['est_tokens_per_s_per_chip']:.0f} tokens/s a chip; {row['total_steps']} steps in "
                  f"{row['est_days']:.2f} days")
    print(f"compute per chip (compiler's estimate, not a measurement): {row['hlo_flops']:.3g} HLO FLOPs, "
          f"{row['model_flops']:.3g} model FLOPs ({row['estimate']}), {timing}")
    kinds = ", ".join(f"{kind} {entry['count']} x / {entry['bytes'] / GB:.3f} GB"
                      for kind, entry in row["collectives"].items()) or "none"
    print(f"collectives per chip and step: {kinds}; {row['collective_gb']:.3f} GB against the layout's ideal "
          f"{row['ideal_gb']:.3f} GB (x{row['collective_gb'] / max(row['ideal_gb'], 1e-12):.2f}); on the wire "
          f"{row['collective_wire_gb']:.3f} GB against {row['ideal_wire_gb']:.3f} GB; state donated: {row['donated']}")
    shares = ", ".join(f"{kind} {share:.0%}" for kind, share in row["cycle_shares"].items())
    kernels = f"splash kernels {row['splash_share']:.0%} of the step; " if row["splash_share"] is not None else ""
    print(f"where the estimate goes: {kernels}the compiler's cycles of the rest: {shares}")


def check(config: ml_collections.ConfigDict, topology: Topology, with_eval: bool = True) -> dict:
    """Compile, report, print; the row of figures (raises DoesNotFit after printing when it does not fit)."""
    row = report(compile_program(config, topology, with_eval))
    print_report(row)
    print(json.dumps(row), flush=True)
    if not row["fits"]:
        raise DoesNotFit(overshoot_message(row, config))
    return row


TOPOLOGY_HELP = "The TPU slice to compile for: v5p-8, v5p-128, v5e-16, v4-32, v6e-64, ... or a chip grid (v5p:4x4x8)."
NUM_SLICES_HELP = "Slices of that topology in a multislice job (data parallelism spans them)."


def main(argv):
    del argv
    set_deviceless_environment(flags.FLAGS.topology)
    check(flags.FLAGS.config, parse_topology(flags.FLAGS.topology, flags.FLAGS.num_slices), flags.FLAGS.eval_step)


if __name__ == "__main__":  # the flags exist for the command only: experiments.compare imports this module
    flags.DEFINE_string("topology", None, TOPOLOGY_HELP, required=True)
    flags.DEFINE_integer("num_slices", 1, NUM_SLICES_HELP)
    flags.DEFINE_bool("eval_step", True, "Compile the evaluation step as well.")
    flags.mark_flag_as_required("config")  # --config is bert_jax.train's; so is --workdir, which nothing here writes
    flags.FLAGS.set_default("workdir", "")
    cli.run(main)
