"""Read a compiled train step: which collectives XLA put in it, how many bytes they move, and what the layout's
textbook pattern would move. Used by benchmarks/sharding.py and tests/test_sharding_audit.py.

Bytes are counted per device and per step, as the size of the data a collective is about: an all-reduce's operand,
an all-gather's result, a reduce-scatter's operand (on a ring an all-reduce puts about twice its size on the wire,
the other two about their size). With that unit the ideal patterns are:
  data parallel    one reduction of the gradients                            sum of local gradient sizes
  FSDP             gather each parameter once + reduce-scatter its gradient  2 x the parameters split over fsdp
  tensor (Megatron) 2 all-reduces of the residual stream per layer forward and 2 backward, plus the vocabulary's
                   (the embedding lookup's forward, the MLM projection's input gradient)
and a mesh that combines axes adds their terms (gradients are then reduced over data x fsdp at their tensor size).
Sequence parallelism turns each of Megatron's all-reduces into a reduce-scatter and an all-gather: twice the bytes
in this unit, the same on the wire.
"""
from __future__ import annotations

import math
import re

import jax
import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(r" = (.*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")  # a computation's header line, at column 0
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}


def array_bytes(shape_text: str) -> int:
    """Bytes of every array in an HLO result type such as `f32[8,128]{1,0}` or `(f32[2], bf16[4,4])`."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _ARRAY.findall(shape_text) if dtype in _BYTES)


def collective_stats(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count", "bytes"}} per step over the compiled module: a collective inside a loop body (scanned layers,
    micro-batches) counts once per iteration; a reduce-scatter by its (group-size larger) operand."""
    stats = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    runs = computation_runs(hlo_text)
    computation = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
        match = _COLLECTIVE.search(line)
        if not match:
            continue
        kind, size = match.group(2), array_bytes(match.group(1))
        if kind == "reduce-scatter":
            size *= group_size(line)
        stats[kind]["count"] += runs(computation)
        stats[kind]["bytes"] += size * runs(computation)
    return stats


def computation_runs(hlo_text: str):
    """name -> how many times that computation runs per step: a while loop's body its known trip count times its
    caller's (1 when XLA does not know the count), every other computation once."""
    loops, computation = {}, None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
        body = re.search(r" while\(.*?body=%([\w.\-]+)", line)
        if body:
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
            loops[body.group(1)] = (int(trips.group(1)) if trips else 1, computation)

    def runs(name: str | None) -> int:
        if name not in loops:
            return 1
        trips, caller = loops[name]
        return trips * runs(caller)

    return runs


def group_size(line: str) -> int:
    """Devices per replica group of a collective, from `replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`,
    the iota form `[4,2]<=[8]` or explicit groups `{{0,1},{2,3}}`."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
    if named:
        sizes = {name: int(size) for name, size in re.findall(r"'([^']+)'=(\d+)", named.group(1))}
        return math.prod(sizes[name] for name in re.findall(r"'([^']+)'", named.group(2)))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if iota:
        return int(iota.group(2))
    groups = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    return len(groups.group(1).split(",")) if groups else 1


def total_bytes(stats: dict) -> int:
    return sum(entry["bytes"] for entry in stats.values())


def split_factor(sharding, axis: str) -> int:
    """How many ways `sharding` splits an array over mesh axis `axis`."""
    spec_axes = [a for entry in sharding.spec if entry for a in (entry if isinstance(entry, tuple) else (entry,))]
    return sharding.mesh.shape[axis] if axis in spec_axes else 1


def ideal_bytes(config, mesh, param_shardings, abstract_params) -> dict[str, int]:
    """The textbook collective bytes per device and step of this layout (module docstring), by term."""
    data, fsdp, tensor = (mesh.shape[a] for a in ("data", "fsdp", "tensor"))
    gradients = gathers = 0
    for leaf, shard in zip(jax.tree.leaves(abstract_params), jax.tree.leaves(param_shardings)):
        local = np.dtype(leaf.dtype).itemsize * math.prod(leaf.shape) // split_factor(shard, "tensor")
        split_over_fsdp = split_factor(shard, "fsdp") > 1
        if data * fsdp > 1:
            gradients += local
            if split_over_fsdp and data > 1:
                gradients += local // fsdp  # the fsdp shard's all-reduce over data after the reduce-scatter
        if split_over_fsdp:
            gathers += local
    activations = tensor_activation_bytes(config, data * fsdp) if tensor > 1 else 0
    if config.mesh.sequence_parallel:
        activations *= 2  # each all-reduce becomes a reduce-scatter and an all-gather: the same wire traffic
    return {"gradient_reduction": gradients, "parameter_gathers": gathers, "tensor_activations": activations}


def tensor_activation_bytes(config, batch_ways: int) -> int:
    """Megatron's all-reduces: 4 of [B, S, H] per layer (forward and backward of attention and FFN), the embedding
    lookup's [B, S, E] over the split vocabulary, and the MLM projection's input gradient [B, P, E]."""
    model, itemsize = config.model, np.dtype(config.model.dtype).itemsize
    batch = config.data.batch_size // batch_ways
    seq, predictions = config.data.seq_length, config.masking.max_predictions_per_seq
    encoders = [(model.num_hidden_layers, model.hidden_size)]
    if config.objective == "rtd":
        encoders.append((model.generator.num_hidden_layers, model.generator.hidden_size))
    layers = sum(4 * count * batch * seq * width for count, width in encoders)
    vocabulary = len(encoders) * batch * seq * model.embedding_size + batch * predictions * model.embedding_size
    return itemsize * (layers + vocabulary)


def donated_inputs(hlo_text: str) -> int:
    """How many entry parameters the compiled module aliases to outputs (donated buffers updated in place)."""
    header = hlo_text.split("\n", 1)[0]
    return len(re.findall(r"\((\d+), \{[\d,]*\}, (?:may|must)-alias\)", header))


def activation_shapes(hlo_text: str, rank: int = 3) -> set[tuple[int, ...]]:
    """Every distinct array shape of the given rank in the module (per device, after SPMD partitioning)."""
    shapes = set()
    for dtype, dims in _ARRAY.findall(hlo_text):
        parts = [int(d) for d in dims.split(",") if d]
        if dtype in _BYTES and len(parts) == rank:
            shapes.add(tuple(parts))
    return shapes
