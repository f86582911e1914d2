"""The same batch gives the same loss on every mesh, and parameters are sharded the way the rules table says."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax import sharding, train
from train_helpers import logged, synthetic_batches, tiny_config

MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]


def test_meshes_agree_and_shard_by_the_rules(tmp_path):
    losses = {}
    for data, fsdp, tensor in MESHES:
        config = tiny_config("bert", total_steps=2, **{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor})
        workdir = tmp_path / f"{data}x{fsdp}x{tensor}"
        state = train.train_and_evaluate(config, str(workdir), synthetic_batches)
        losses[(data, fsdp, tensor)] = logged(workdir)
    # Step 2's loss depends on the first update, so it also checks the gradient reductions across the mesh.
    for mesh in MESHES[1:]:
        np.testing.assert_allclose(list(losses[mesh].values()), list(losses[MESHES[0]].values()), atol=1e-5)

    params = state["params"]  # from the (2, 2, 2) mesh
    words = params["backbone"]["embeddings"]["word_embeddings"]["embedding"]  # [vocab, token_embed]
    ffn = params["backbone"]["encoder"]["layer_0"]["intermediate"]["kernel"]  # [embed, mlp]
    query = params["backbone"]["encoder"]["layer_0"]["query"]["kernel"]  # [embed, heads, kv]
    assert words.sharding.spec == P("tensor", "fsdp")
    assert ffn.sharding.spec == P("fsdp", "tensor")
    assert query.sharding.spec == P("fsdp", "tensor", None)
    assert words.addressable_shards[0].data.shape == (words.shape[0] // 2, words.shape[1] // 2)
    adam_mu = state["opt_state"][1][0].mu["backbone"]["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert adam_mu.sharding.spec == P("fsdp", "tensor")


def test_bad_meshes_fail_before_compute(tmp_path):
    with pytest.raises(sharding.MeshError, match="must equal the 8 devices"):
        train.train_and_evaluate(tiny_config("bert", **{"mesh.data": 3}), str(tmp_path / "a"), synthetic_batches)
    with pytest.raises(sharding.MeshError, match="batch_size: batches of 8 .*do not split over mesh data\\*fsdp = 8"):
        train.train_and_evaluate(tiny_config("bert", **{"optimizer.grad_accum_steps": 2}), str(tmp_path / "b"),
                                 synthetic_batches)
    assert jax.device_count() == 8
