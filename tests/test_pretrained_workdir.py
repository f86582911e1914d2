"""bert_jax workdirs (config.json + Orbax checkpoints/<step>/{params,train_state}, as the trainer writes them) load
onto the CPU or sharded onto a mesh; an ELECTRA run gives its generator, discriminator or both."""
import json
import logging

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec

import bert_jax
from bert_jax.pretrained import LoadError
from bert_jax import config_lib, modeling, sharding

SIZES = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32, embedding_size=32)


def write_workdir(workdir, config, steps=(10, 20)):
    """A trainer-style workdir: the full config, and per step the params plus a train_state item."""
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    model = modeling.pretraining_model(config)
    shapes = nn.unbox(modeling.abstract_params(model))
    saved = {}
    with ocp.CheckpointManager(workdir / "checkpoints") as manager:
        for step in steps:
            rng = np.random.default_rng(step)
            saved[step] = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
            train_state = {"step": np.int32(step), "opt_state": jax.tree.map(np.zeros_like, saved[step])}
            manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(saved[step]),
                                                       train_state=ocp.args.StandardSave(train_state)))
        manager.wait_until_finished()
    return saved


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    config = config_lib.load_preset("bert", "tiny")
    with config.unlocked():
        config.model.update(SIZES, scan_layers=True)
    workdir = tmp_path_factory.mktemp("runs") / "bert"
    return workdir, write_workdir(workdir, config)


def test_latest_or_given_step_restores_exactly(bert_run, caplog):
    workdir, saved = bert_run
    latest = bert_jax.load_pretrained(workdir)
    # Only "params" is read: no Orbax warning about the train_state item it was not asked for.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert latest.head == "pretraining" and latest.config.scan_layers
    assert "layers" in latest.params["backbone"]["encoder"]
    jax.tree.map(np.testing.assert_array_equal, latest.params, saved[20])
    earlier = bert_jax.load_pretrained(workdir / "checkpoints" / "10", head="backbone")
    jax.tree.map(np.testing.assert_array_equal, earlier.params, saved[10]["backbone"])


def test_restores_sharded_onto_a_mesh(bert_run):
    workdir, saved = bert_run
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    on_mesh = bert_jax.load_pretrained(workdir, mesh=mesh)
    words = on_mesh.params["backbone"]["embeddings"]["word_embeddings"]["embedding"]
    assert words.sharding.mesh.shape == mesh.shape and words.sharding.spec == PartitionSpec("tensor", "fsdp")
    assert len(words.addressable_shards) == 8
    assert words.addressable_shards[0].data.shape == (words.shape[0] // 2, words.shape[1] // 2)  # tensor x fsdp
    jax.tree.map(np.testing.assert_array_equal, on_mesh.params, saved[20])
    on_cpu = bert_jax.load_pretrained(workdir)
    ids = np.arange(12, dtype=np.int32).reshape(2, 6) + 5
    np.testing.assert_allclose(on_mesh.encode(ids)["last_hidden_state"], on_cpu.encode(ids)["last_hidden_state"],
                               atol=1e-5)


def test_electra_run_gives_generator_discriminator_or_both(tmp_path):
    config = config_lib.load_preset("electra", "tiny")
    saved = write_workdir(tmp_path / "electra", config, steps=(5,))[5]
    both = bert_jax.load_pretrained(tmp_path / "electra")
    assert both.head == "both"
    generator = bert_jax.load_pretrained(tmp_path / "electra", head="generator")
    assert generator.config.hidden_size == config.model.generator.hidden_size
    np.testing.assert_array_equal(generator.params["mlm_head"]["bias"], saved["generator_head"]["bias"])
    discriminator = bert_jax.load_pretrained(tmp_path / "electra", head="discriminator")
    np.testing.assert_array_equal(discriminator.params["backbone"]["embeddings"]["word_embeddings"]["embedding"],
                                  saved["embeddings"]["word_embeddings"]["embedding"])
    with pytest.raises(LoadError, match="does not contain head='pretraining'"):
        bert_jax.load_pretrained(tmp_path / "electra", head="pretraining")


def test_saved_bert_jax_format_is_the_workdir_layout(bert_run, tmp_path, monkeypatch):
    workdir, saved = bert_run
    monkeypatch.chdir(tmp_path)  # a relative path, as --workdir=runs/compare gives the comparison (Orbax: absolute)
    bert_jax.save_pretrained(bert_jax.load_pretrained(workdir), "copy", format="bert_jax")
    written = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert written["objective"] == "mlm_nsp" and written["model"]["scan_layers"]
    with ocp.CheckpointManager(tmp_path / "copy" / "checkpoints") as manager:
        assert manager.latest_step() == 0
        params = manager.restore(0, args=ocp.args.Composite(params=ocp.args.StandardRestore()))["params"]
    jax.tree.map(np.testing.assert_array_equal, params, saved[20])


def test_params_that_do_not_fit_config_json_are_refused(tmp_path):
    config = config_lib.load_preset("bert", "tiny")
    with config.unlocked():
        config.model.update(SIZES)
    write_workdir(tmp_path / "run", config, steps=(3,))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    saved["model"]["intermediate_size"] = 48
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(LoadError, match=r"checkpoints/3: params do not match config.json.*"
                                        r"layer_0/intermediate/kernel: checkpoint \(32, 64\) vs model \(32, 48\)"):
        bert_jax.load_pretrained(tmp_path / "run")
