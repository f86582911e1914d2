"""ModernBERT against transformers (PyTorch, CPU): random weights, float32, sliding windows shorter than the input.

Import (HF state dict -> params) and export (params -> HF state dict, loaded into transformers) both go through the
family file's name table, so each direction is checked against transformers' own forward pass.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn
from train_helpers import as_users_compile

import bert_jax
from bert_jax import config_lib, families, modeling, state_dict
from bert_jax.families import modernbert
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import tokenizers
from bert_jax.modeling.models import MASKED_LOGIT, count_params

ATOL = 1e-5
VOCAB = 500  # padded to 768 rows here
SEQ = 24  # > 2 x the half window of 4, so local layers see only part of the row


def masked_lm(config) -> nn.Module:
    """What the registry builds for a ModernBERT with an MLM head (the family's Encoder and MlmHead)."""
    return modeling.PreTrainingModel(config, sentence_head=False)


def mlm_logits(config, params, input_ids, attention_mask):
    outputs = as_users_compile(jax.jit(masked_lm(config).apply), {"params": params}, input_ids, attention_mask)
    return outputs["mlm_logits"]


def hf_small_config(attn_implementation: str, biases: bool = False) -> transformers.ModernBertConfig:
    """4 layers (global, local, local, global), window 8, with or without every optional bias."""
    return transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=128, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0,
        bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2,
        attention_bias=biases, mlp_bias=biases, norm_bias=biases, classifier_bias=biases,
        attn_implementation=attn_implementation)


def our_config(hf_config: transformers.ModernBertConfig):
    return config_lib.model_config("modernbert", **modernbert.sizes_from_hf(hf_config.to_dict()))


def randomize(torch_model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter random (norm scales around 1), so that a mis-mapped tensor cannot hide behind a constant."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if "norm.weight" in name else 0.1 * noise)
    return torch_model.eval()


def batch():
    """Two rows: one full, one with its last 9 positions padded."""
    input_ids = np.random.default_rng(0).integers(5, VOCAB, size=(2, SEQ))
    attention_mask = np.ones_like(input_ids)
    attention_mask[1, SEQ - 9:] = 0
    input_ids[1, SEQ - 9:] = 0
    return input_ids, attention_mask


def params_from_torch(torch_model, config, head: str):
    """bert_jax params from a torch model's state dict, through the library's import (the family's name table);
    it refuses a missing, unexpected or mis-shaped tensor."""
    return state_dict.params_from_hf({k: v.numpy() for k, v in torch_model.state_dict().items()}, config, head)


def params_to_torch_state(params, config, head: str) -> dict:
    return {name: torch.tensor(array) for name, array in state_dict.params_to_hf(params, config, head).items()}


def random_backbone(hf_config):
    """A random ModernBertModel, our config of it, and its weights as bert_jax params."""
    torch_model = randomize(transformers.ModernBertModel(hf_config))
    config = our_config(hf_config)
    return torch_model, config, params_from_torch(torch_model, config, "backbone")


def torch_run(torch_model, input_ids, attention_mask):
    with torch.no_grad():
        out = torch_model(input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask))
    return out.logits.numpy() if hasattr(out, "logits") else out.last_hidden_state.numpy()


def max_error(ours, reference, attention_mask) -> float:
    real = attention_mask > 0  # padded positions differ by design (HF lets them attend to anything)
    return float(np.max(np.abs(np.asarray(ours)[real] - reference[real])))


@pytest.fixture(scope="module")
def tiny():
    """The tiny preset and random MaskedLM parameters for it, as numpy (initialised once: init is slow)."""
    config = config_lib.model_config("modernbert", **{**modernbert.MODEL_DEFAULTS, **modernbert.SIZES["tiny"]})
    params = jax.jit(masked_lm(config).init)(jax.random.key(1), jnp.ones((1, 8), jnp.int32))["params"]
    return config, jax.tree.map(np.asarray, nn.unbox(params))


@pytest.mark.parametrize("attn_implementation,biases", [("eager", False), ("sdpa", False), ("eager", True)])
def test_backbone_matches_transformers(attn_implementation, biases):
    hf_config = hf_small_config(attn_implementation, biases)
    torch_model, config, params = random_backbone(hf_config)
    input_ids, attention_mask = batch()
    ours = as_users_compile(jax.jit(modernbert.Encoder(config).apply), {"params": params}, input_ids,
                            attention_mask)["last_hidden_state"]
    assert max_error(ours, torch_run(torch_model, input_ids, attention_mask), attention_mask) < ATOL


def test_window_matters():
    """The sliding window is live at this length: a global-only model gives different outputs."""
    hf_config = hf_small_config("eager")
    torch_model, config, params = random_backbone(hf_config)
    input_ids, attention_mask = batch()
    config.local_attention = 2 * SEQ
    ours = modernbert.Encoder(config).apply({"params": params}, input_ids, attention_mask)["last_hidden_state"]
    assert max_error(ours, torch_run(torch_model, input_ids, attention_mask), attention_mask) > 1e-3


def test_masked_lm_matches_transformers():
    hf_config = hf_small_config("eager")
    torch_model = randomize(transformers.ModernBertForMaskedLM(hf_config))
    config = our_config(hf_config)
    params = params_from_torch(torch_model, config, "masked_lm")
    input_ids, attention_mask = batch()
    logits = mlm_logits(config, params, input_ids, attention_mask)
    assert logits.shape[-1] == 768 and np.all(np.asarray(logits[..., VOCAB:]) == MASKED_LOGIT)
    reference = torch_run(torch_model, input_ids, attention_mask)
    assert max_error(logits[..., :VOCAB], reference, attention_mask) < ATOL


def test_export_loads_into_transformers_and_round_trips(tiny):
    config, params = tiny
    input_ids, attention_mask = batch()
    exported = params_to_torch_state(params, config, "masked_lm")

    hf_config = transformers.ModernBertConfig(**modernbert.hf_config(config, "masked_lm"))
    hf_config._attn_implementation = "eager"
    torch_model = transformers.ModernBertForMaskedLM(hf_config).eval()
    missing, unexpected = torch_model.load_state_dict(exported, strict=False)
    assert set(missing) <= {"decoder.weight"} and not unexpected
    assert torch_model.decoder.weight is torch_model.model.embeddings.tok_embeddings.weight

    ours = mlm_logits(config, params, input_ids, attention_mask)[..., :config.vocab_size]
    assert max_error(ours, torch_run(torch_model, input_ids, attention_mask), attention_mask) < ATOL

    reimported = state_dict.params_from_hf({k: v.numpy() for k, v in exported.items()}, config, "masked_lm")
    jax.tree.map(np.testing.assert_array_equal, reimported, params)


def test_hf_config_round_trips():
    config = config_lib.model_config("modernbert", **{**modernbert.MODEL_DEFAULTS, **modernbert.SIZES["base"]})
    hf = transformers.ModernBertConfig(**modernbert.hf_config(config, "backbone")).to_dict()
    assert hf["layer_types"][:4] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    again = config_lib.model_config("modernbert", **modernbert.sizes_from_hf(hf))
    assert again.to_dict() == config.to_dict()




def test_packed_rows_match_separate_rows(tiny):
    """Row 0 packs two examples; rows 1 and 2 hold each alone (padded); RoPE and windows see only distances."""
    config, params = tiny[0], {"params": tiny[1]["backbone"]}
    ids = np.random.default_rng(1).integers(5, config.vocab_size, size=20)
    alone = lambda part: np.pad(part, (0, 20 - len(part)))
    input_ids = jnp.asarray(np.stack([ids, alone(ids[:12]), alone(ids[12:])]))
    attention_mask = jnp.asarray(np.stack([np.ones(20), alone(np.ones(12)), alone(np.ones(8))]), jnp.int32)
    segments = jnp.asarray([[1] * 12 + [2] * 8, [1] * 20, [1] * 20])
    hidden = jax.jit(modernbert.Encoder(config).apply)(params, input_ids, attention_mask,
                                                        packing_segment_ids=segments)["last_hidden_state"]
    np.testing.assert_allclose(hidden[0, :12], hidden[1, :12], atol=ATOL)
    np.testing.assert_allclose(hidden[0, 12:], hidden[2, :8], atol=ATOL)


def test_dropout_when_training(tiny):
    """hidden_dropout_prob and attention_probs_dropout_prob act with deterministic=False: two seeds differ."""
    config, params = tiny[0], {"params": tiny[1]["backbone"]}
    config = config.copy_and_resolve_references()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
    model, ids = modernbert.Encoder(config), jnp.ones((1, 8), jnp.int32)
    run = jax.jit(lambda seed: model.apply(params, ids, deterministic=False,
                                           rngs={"dropout": jax.random.key(seed)})["last_hidden_state"])
    assert not np.allclose(run(0), run(1))


PAPER_MILLIONS = {"base": 149, "large": 395}


@pytest.mark.parametrize("size", ["base", "large"])
def test_parameter_counts_match_transformers(size):
    config = config_lib.model_config("modernbert", **{**modernbert.MODEL_DEFAULTS, **modernbert.SIZES[size]})
    ids = jnp.zeros((1, 8), jnp.int32)
    ours = count_params(jax.eval_shape(modernbert.Encoder(config).init, jax.random.key(0), ids)["params"], config)
    with torch.device("meta"):
        reference = transformers.ModernBertModel(transformers.ModernBertConfig(
            **modernbert.hf_config(config, "backbone")))
    assert ours == sum(p.numel() for p in reference.parameters())
    assert round(ours / 1e6) == PAPER_MILLIONS[size]


def test_load_pretrained_and_save_pretrained_through_hf_folders(tmp_path):
    """The public path: an HF ModernBertForMaskedLM folder loads (head masked_lm), exports back to a folder that
    transformers loads with the same outputs, and its backbone encodes as ModernBertModel does."""
    torch_model = randomize(transformers.ModernBertForMaskedLM(hf_small_config("eager")))
    torch_model.save_pretrained(tmp_path / "hf")
    loaded = bert_jax.load_pretrained(tmp_path / "hf")
    assert (loaded.config.family, loaded.head) == ("modernbert", "masked_lm")
    input_ids, attention_mask = batch()
    reference = torch_run(torch_model, input_ids, attention_mask)
    logits = mlm_logits(loaded.config, loaded.params, input_ids, attention_mask)[..., :VOCAB]
    assert max_error(logits, reference, attention_mask) < ATOL

    bert_jax.save_pretrained(loaded, tmp_path / "export")
    again = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path / "export", attn_implementation="eager")
    assert max_error(logits, torch_run(again.eval(), input_ids, attention_mask), attention_mask) < ATOL

    backbone = bert_jax.load_pretrained(tmp_path / "export", head="backbone")
    hidden = backbone.encode(input_ids, attention_mask)["last_hidden_state"]
    assert max_error(hidden, torch_run(torch_model.model, input_ids, attention_mask), attention_mask) < ATOL


def test_export_writes_the_tokenizers_special_token_ids(tiny, tmp_path):
    """HF's ModernBertConfig numbers [CLS] (bos, cls) and [SEP] (eos, sep) as the released 50k vocabulary does; the
    tiny preset's 8k tokenizer has them at 0 and 2. An export writes its tokenizer's ids; without a tokenizer, the
    released ids where the vocabulary holds them, else None: never an id outside the vocabulary."""
    config, params = tiny
    bundled = families.get("modernbert").tokenizer
    tokenizer = tokenizers.load_tokenizer(bundled.kind, input_config.resolve_path(bundled.tiny_path))
    bert_jax.save_pretrained(bert_jax.Pretrained(config, "masked_lm", params, tokenizer), tmp_path / "export")
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "export")
    assert (exported.bos_token_id, exported.cls_token_id, exported.eos_token_id, exported.sep_token_id) == (0, 0, 2, 2)
    assert (tokenizer.special.cls, tokenizer.special.sep) == (0, 2)

    without_tokenizer = state_dict.config_to_hf(config, "masked_lm")
    assert all(without_tokenizer[key] is None for key in state_dict.SPECIAL_TOKEN_ROLES)


@pytest.mark.parametrize("family", ["roberta", "albert", "modernbert"])
def test_released_special_token_ids_are_transformers_defaults(family):
    """At the released vocabulary's size, an export without a tokenizer writes what transformers' config class
    defaults to (the released tokenizer's ids)."""
    written = state_dict.special_token_ids(config_lib.load_preset(family).model)
    defaults = transformers.AutoConfig.for_model(family)
    assert written == {key: getattr(defaults, key) for key in written} and len(written) >= 2
