"""The one place where the models' logical axis names meet the device mesh (axes data, fsdp, tensor).

Modules name their parameters' axes logically (vocab, embed, mlp, heads, ...); this ordered table maps each name
to a mesh axis. Earlier rules win, and a mesh axis is used at most once per array, so e.g. the E -> H projection
[token_embed, embed] shards `embed` over fsdp and leaves `token_embed` whole.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXIS_RULES = (
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


class MeshError(ValueError):
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
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


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
