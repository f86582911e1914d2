"""Read a compiled train step: which collectives XLA put in it, how many bytes they move, and what the layout's
textbook pattern would move. Used by benchmarks/sharding.py, bert_jax.compile_check and tests/test_sharding_audit.py.

The same count holds for XLA:CPU's text and XLA:TPU's, which writes collectives differently:
  - asynchronous pairs `x-start` / `x-done`: counted once, at the done, whose result is the collective's result;
  - a reduce-scatter fused with its all-reduce (`fusion(...), calls=%all-reduce-scatter.N`): the all-reduce inside
    that computation counts as the reduce-scatter it is;
  - collectives wrapped in `async-start(...), calls=%computation`, or inside fusions, conditionals and loops: a
    computation runs as often as everything that calls it, a while body its known trip count times per call;
  - one collective carried through a chain of fusions (XLA:TPU's continuation fusions, each doing a piece of it
    next to some compute, tagged `frontend_attributes={chain_id="N"}`): every link repeats the same instruction, and
    the chain counts as often as its least-run link (chain_runs).

Bytes are counted per device and per step, as the size of the data a collective is about: an all-reduce's operand,
an all-gather's result, a reduce-scatter's operand. On a ring an all-reduce puts about twice that on the wire (a
reduce-scatter, then an all-gather), the others about their size: `wire_bytes` applies those factors. With the data
unit the ideal patterns are:
  data parallel    one all-reduce of the gradients                           sum of local gradient sizes
  FSDP (ZeRO-3)    gather each parameter for the forward pass and again      3 x the parameters split over fsdp
                   for the backward, reduce-scatter its gradient
  tensor (Megatron) 2 all-reduces of the residual stream per layer forward and 2 backward, plus the vocabulary's
                   (the embedding lookup's forward, the MLM projection's input gradient)
and a mesh that combines axes adds their terms (gradients are then reduced over data x fsdp at their tensor size).
Sequence parallelism turns each of Megatron's all-reduces into a reduce-scatter and an all-gather: twice the bytes
in this unit, the same on the wire. Under bfloat16 compute the matrices (every parameter of two or more dimensions)
are gathered and their gradients reduced in bfloat16, the vectors (biases, LayerNorms) in their stored dtype.
"""
from __future__ import annotations

import functools
import math
import re

import jax
import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Bytes on a ring per byte of the data unit: an all-reduce is a reduce-scatter followed by an all-gather.
WIRE_FACTOR = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1, "collective-permute": 1}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) (" + "|".join(COLLECTIVES) + r")(-start|-done)?\(")
_DONE_OF = re.compile(r"-done\(%([\w.\-]+)")
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) \(")  # a computation's header line, at column 0
_CALLEE = re.compile(r"\b(calls|body|condition|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_CALLEES = re.compile(r"\b(?:calls|branch_computations)=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CHAIN = re.compile(r'\bchain_id="(\d+)"')
FUSED_REDUCE_SCATTER = "all-reduce-scatter"  # XLA:TPU's computation holding an all-reduce and the slice after it
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}


def array_bytes(shape_text: str) -> int:
    """Bytes of every array in an HLO result type such as `f32[8,128]{1,0}` or `(f32[2], bf16[4,4])`."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _ARRAY.findall(shape_text) if dtype in _BYTES)


def computations(hlo_text: str) -> dict[str, tuple[bool, list[str]]]:
    """{computation name: (whether it is the entry, its instruction lines)} of an HLO module's text."""
    found, lines = {}, None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            lines = []
            found[header.group(2)] = (bool(header.group(1)), lines)
        elif lines is not None:
            lines.append(line)
    return found


def collective_stats(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count", "bytes"}} per step over the compiled module, in the data unit of the module docstring; a
    collective counts as often as its computation runs (a loop body: once per iteration)."""
    stats = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    module = computations(hlo_text)
    runs = computation_runs(module)
    uncounted_chains = chain_runs(module, runs)
    for computation, (_, lines) in module.items():
        start_groups = {}
        for line in lines:
            op = _INSTRUCTION.match(line)
            if not op:
                continue
            name, result, kind, phase = op.groups()
            if phase == "-start":  # counted at its done, whose result is the collective's own result
                start_groups[name] = group_size(line)
                continue
            times = runs(computation)
            chain = _CHAIN.search(line)
            if chain:
                times = uncounted_chains.pop(chain.group(1), None)
                if times is None:  # a later link of a collective already counted
                    continue
            group = start_groups.get(_DONE_OF.search(line).group(1), 1) if phase == "-done" else group_size(line)
            size = array_bytes(result)
            if kind == "reduce-scatter":
                size *= group  # its operand: the result times the group
            elif computation.startswith(FUSED_REDUCE_SCATTER):
                kind = "reduce-scatter"  # the all-reduce's operand is the fused reduce-scatter's operand
            stats[kind]["count"] += times
            stats[kind]["bytes"] += size * times
    return stats


def chain_runs(module: dict[str, tuple[bool, list[str]]], runs) -> dict[str, int]:
    """chain id -> how many times that chained collective runs per step: as often as its least-run link. A chain
    begun before a loop and carried on by links in the loop's body (XLA:TPU spreads a gather over the iterations)
    moves its data once; a chain wholly inside a body runs once per iteration."""
    found = {}
    for computation, (_, lines) in module.items():
        for chain in filter(None, map(_CHAIN.search, lines)):
            found[chain.group(1)] = min(found.get(chain.group(1), runs(computation)), runs(computation))
    return found


def computation_runs(module: dict[str, tuple[bool, list[str]]]):
    """name -> how many times that computation runs per step: the entry once; any other as often as its callers run,
    times its trip count for a while loop's body (loop_trips; conditional branches count as if taken). A computation
    nothing calls counts once."""
    callers: dict[str, list[tuple[str, int]]] = {}
    for caller, (_, lines) in module.items():
        for line in lines:
            for role, callee in _CALLEE.findall(line):
                callers.setdefault(callee, []).append((caller, loop_trips(line, module) if role == "body" else 1))
            for group in _CALLEES.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    callers.setdefault(callee, []).append((caller, 1))

    @functools.cache
    def runs(name: str) -> int:
        if name not in callers or module.get(name, (True,))[0]:
            return 1
        return sum(trips * runs(caller) for caller, trips in callers[name])

    return runs


def loop_trips(while_line: str, module: dict[str, tuple[bool, list[str]]]) -> int:
    """Iterations of a while loop: XLA:CPU's known_trip_count, or (XLA:TPU drops it) the bound N of its condition
    `compare(%counter, %constant), direction=LT` with `%constant = s32[] constant(N)`, as a scan's loop writes it
    (counter from 0 by 1); 1 when neither is there."""
    known = _TRIPS.search(while_line)
    if known:
        return int(known.group(1))
    condition = re.search(r"condition=%([\w.\-]+)", while_line)
    lines = module.get(condition.group(1), (False, []))[1] if condition else []
    constants = dict(re.findall(r"%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", "\n".join(lines)))
    for line in lines:
        compare = re.search(r"compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT", line)
        if compare and compare.group(1) in constants:
            return int(constants[compare.group(1)])
    return 1


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


def wire_bytes(stats: dict) -> int:
    """About what the collectives put on the wire per device on a ring (WIRE_FACTOR)."""
    return sum(WIRE_FACTOR[kind] * entry["bytes"] for kind, entry in stats.items())


def split_factor(sharding, axis: str) -> int:
    """How many ways `sharding` splits an array over mesh axis `axis`."""
    spec_axes = [a for entry in sharding.spec if entry for a in (entry if isinstance(entry, tuple) else (entry,))]
    return sharding.mesh.shape[axis] if axis in spec_axes else 1


# Each term of the ideal, and its wire factor: gradients split over fsdp are reduce-scattered, the rest all-reduced.
IDEAL_WIRE_FACTOR = {"gradient_all_reduce": 2, "gradient_reduce_scatter": 1, "parameter_gathers": 1,
                     "tensor_activations": 2}


def collective_itemsize(leaf, config) -> int:
    """Bytes per element a parameter's gathers and gradient reductions move: matrices in the compute dtype (they are
    cast before use, and XLA moves the cast's other side of the collective), vectors in their stored dtype."""
    if len(leaf.shape) >= 2:
        return min(np.dtype(leaf.dtype).itemsize, np.dtype(config.model.dtype).itemsize)
    return np.dtype(leaf.dtype).itemsize


def ideal_bytes(config, mesh, param_shardings, abstract_params) -> dict[str, int]:
    """The textbook collective bytes per device and step of this layout (module docstring), by term
    (IDEAL_WIRE_FACTOR's)."""
    data, fsdp, tensor = (mesh.shape[a] for a in ("data", "fsdp", "tensor"))
    terms = dict.fromkeys(IDEAL_WIRE_FACTOR, 0)
    for leaf, shard in zip(jax.tree.leaves(abstract_params), jax.tree.leaves(param_shardings)):
        local = collective_itemsize(leaf, config) * math.prod(leaf.shape) // split_factor(shard, "tensor")
        split_over_fsdp = split_factor(shard, "fsdp") > 1
        if split_over_fsdp:
            terms["parameter_gathers"] += 2 * local  # forward and backward: gathered weights are not kept between
            terms["gradient_reduce_scatter"] += local
            if data > 1:
                terms["gradient_all_reduce"] += local // fsdp  # the fsdp shard's all-reduce over data
        elif data * fsdp > 1:
            terms["gradient_all_reduce"] += local
    if tensor > 1:
        terms["tensor_activations"] = tensor_activation_bytes(config, data * fsdp)
        if config.mesh.sequence_parallel:
            terms["tensor_activations"] *= 2  # each all-reduce becomes a reduce-scatter and an all-gather
    return terms


def ideal_wire_bytes(config, terms: dict[str, int]) -> int:
    """The ideal's bytes on the wire: its terms times their wire factors (sequence parallelism's reduce-scatters and
    all-gathers move their size each)."""
    factors = dict(IDEAL_WIRE_FACTOR, tensor_activations=1 if config.mesh.sequence_parallel else 2)
    return sum(factors[term] * size for term, size in terms.items())


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
