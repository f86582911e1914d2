"""The one place where the models' logical axis names meet the device mesh (axes data, fsdp, tensor).

Modules name their parameters' axes logically (vocab, embed, mlp, heads, ...) and pin their activations with names
of their own (activation_batch, activation_embed, ...); one ordered table maps both to mesh axes. Earlier rules win,
and a mesh axis is used at most once per array, so e.g. the E -> H projection [token_embed, embed] shards `embed`
over fsdp and leaves `token_embed` whole.

The layouts this gives: parameters and optimizer state split over fsdp (FSDP/ZeRO-3) and, Megatron-style, over
tensor along heads, FFN width and vocabulary; activations split over data x fsdp along the batch and over tensor
along heads / FFN width / vocabulary inside attention, the FFN and the MLM logits. With sequence parallelism the
residual stream between those (LayerNorm, dropout, residual adds) is split over tensor along the sequence too,
instead of being repeated on every tensor device.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import numpy as np
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bert_jax.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
PARAMETER_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("token_embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("positions", None),
    ("token_types", None),
    ("classes", None),
    ("layers", None),
)
ACTIVATION_RULES = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_vocab", "tensor"),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_length", None),  # "tensor" under sequence parallelism
    ("activation_heads_length", None),  # the sequence inside attention and the FFN: whole on every device
    ("activation_embed", None),
    ("activation_kv", None),
)
LOGICAL_AXIS_RULES = PARAMETER_RULES + ACTIVATION_RULES


def logical_axis_rules(sequence_parallel: bool = False) -> tuple:
    """The rules table; sequence parallelism splits the residual stream's sequence axis over tensor."""
    if not sequence_parallel:
        return LOGICAL_AXIS_RULES
    return tuple((name, "tensor" if name == "activation_length" else axis) for name, axis in LOGICAL_AXIS_RULES)


# The rules `constrain` applies, set only while a step is traced. Not Flax's own rules context: under that, Flax
# also constrains every parameter it unboxes, DenseGeneral's flattened init shapes included, which then fail.
_ACTIVE_RULES = contextvars.ContextVar("bert_jax_activation_rules", default=None)
# The platform of the mesh a step is traced for: a step compiled for a TPU topology on a CPU machine is a TPU step.
_TARGET_PLATFORM = contextvars.ContextVar("bert_jax_target_platform", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, sequence_parallel: bool = False):
    """While tracing inside this context (it may be entered inside jit) the models' activation constraints take
    effect on `mesh`; outside it they are no-ops."""
    token = _ACTIVE_RULES.set(logical_axis_rules(sequence_parallel))
    platform = _TARGET_PLATFORM.set(mesh.devices.flat[0].platform)
    try:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            yield
    finally:
        _TARGET_PLATFORM.reset(platform)
        _ACTIVE_RULES.reset(token)


def constrain(x, names: tuple):
    """Pin an activation's layout by logical names; a no-op outside `activation_sharding`."""
    rules = _ACTIVE_RULES.get()
    return x if rules is None else nn.with_logical_constraint(x, names, rules=rules)


def active_spec(names: tuple) -> PartitionSpec | None:
    """The mesh PartitionSpec that `constrain` gives these logical names, or None outside `activation_sharding`
    (where a kernel that must be mapped over shards runs on whole arrays)."""
    rules = _ACTIVE_RULES.get()
    return None if rules is None else nn.logical_to_mesh_axes(names, rules)


def target_platform() -> str:
    """The platform the step being traced will run on: its mesh's inside `activation_sharding`, else JAX's default."""
    return _TARGET_PLATFORM.get() or jax.default_backend()


class MeshError(UserError, ValueError):
    """A mesh shape that the devices or the batch cannot take; the message says which and what would fit."""


def make_mesh(data: int, fsdp: int, tensor: int, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over all devices; -1 in one axis takes whatever the others leave."""
    devices = jax.devices() if devices is None else devices
    shape = [data, fsdp, tensor]
    if shape.count(-1) > 1:
        raise MeshError(f"config.mesh {dict(zip(MESH_AXES, shape))}: at most one axis may be -1")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if known <= 0 or len(devices) % known:
            raise MeshError(f"config.mesh {dict(zip(MESH_AXES, shape))}: {len(devices)} devices do not divide by "
                            f"{known}")
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices) or min(shape) < 1:
        raise MeshError(f"config.mesh data*fsdp*tensor = {'*'.join(map(str, shape))} must equal the "
                        f"{len(devices)} devices; set one axis to -1 to fill the rest")
    slices = len({getattr(device, "slice_index", 0) for device in devices})
    if slices == 1:
        return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    # Multislice: slices talk over the data-center network, so only `data` (one gradient all-reduce a step) spans
    # them; fsdp and tensor stay inside each slice's own interconnect.
    if shape[0] % slices:
        raise MeshError(f"config.mesh.data={shape[0]} must be a multiple of the {slices} slices: data parallelism is "
                        "what spans slices; set mesh.data to -1 or a multiple of the slice count")
    grid = mesh_utils.create_hybrid_device_mesh([shape[0] // slices, *shape[1:]], [slices, 1, 1], devices)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def split_sizes(model_config, seq_length: int, sequence_parallel: bool, padded_vocab_size: int):
    """(config key, size, mesh axis) of every size the rules split over a mesh axis."""
    sizes = [("model.num_attention_heads", model_config.num_attention_heads, "tensor"),
             ("model.intermediate_size", model_config.intermediate_size, "tensor"),
             ("model.vocab_size", padded_vocab_size, "tensor"),
             ("model.hidden_size", model_config.hidden_size, "fsdp"),
             ("model.embedding_size", model_config.embedding_size, "fsdp")]
    generator = model_config.generator
    if generator.hidden_size > 0:
        sizes += [("model.generator.num_attention_heads", generator.num_attention_heads, "tensor"),
                  ("model.generator.intermediate_size", generator.intermediate_size, "tensor"),
                  ("model.generator.hidden_size", generator.hidden_size, "fsdp")]
    if sequence_parallel:
        sizes.append(("data.seq_length", seq_length, "tensor"))
    return sizes


def check_model_fits(model_config, mesh: Mesh, seq_length: int, sequence_parallel: bool,
                     padded_vocab_size: int) -> None:
    """Raise MeshError naming the config key whose size the rules would split unevenly over `mesh`, and the axis
    sizes that every size accepts, before anything compiles (jit's own IndivisibleError comes as a traceback from
    deep inside init)."""
    sizes = split_sizes(model_config, seq_length, sequence_parallel, padded_vocab_size)
    for key, size, axis in sizes:
        ways = mesh.shape[axis]
        if size % ways == 0:
            continue
        accepted = [d for d in range(1, 65) if all(other % d == 0 for _, other, a in sizes if a == axis)]
        shown = (f"{model_config.vocab_size} (padded to {size} rows)" if key == "model.vocab_size" else size)
        raise MeshError(f"config.{key}={shown} does not split over mesh {axis}={ways}"
                        f"{' (mesh.sequence_parallel=True)' if key == 'data.seq_length' else ''}; choose mesh.{axis} "
                        f"among {accepted}")


def laid_out(fn, mesh: Mesh, sequence_parallel: bool = False):
    """`fn`, traced (under jax.jit) with the activation constraints in effect on `mesh`."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with activation_sharding(mesh, sequence_parallel):
            return fn(*args, **kwargs)

    return traced


def without_axis(named: NamedSharding, axis: str) -> NamedSharding:
    """The layout of a copy gathered over mesh axis `axis`: the other axes split it as before."""

    def drop(entry):
        kept = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a not in (axis, None))
        return kept[0] if len(kept) == 1 else kept or None

    return NamedSharding(named.mesh, PartitionSpec(*map(drop, named.spec)))


def logical_partition_specs(boxed_tree):
    """PartitionSpecs of logical names for a tree of nn.LogicallyPartitioned leaves (e.g. abstract params)."""
    return nn.get_partition_spec(boxed_tree)


def mesh_shardings(boxed_tree, mesh: Mesh):
    """NamedShardings for every leaf of a tree boxed with logical names, through LOGICAL_AXIS_RULES."""
    return nn.logical_to_mesh_sharding(logical_partition_specs(boxed_tree), mesh, LOGICAL_AXIS_RULES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches are split along their first axis over data x fsdp; the rest of each array is whole."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), LOGICAL_AXIS_RULES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
