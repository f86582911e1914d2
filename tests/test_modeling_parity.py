"""bert_jax's four families against transformers (PyTorch, CPU) with every weight random, to float32 rounding."""
import jax
import numpy as np
import pytest
import torch
import transformers

from train_helpers import as_users_compile

from bert_jax import modeling, state_dict
from bert_jax.modeling.models import MASKED_LOGIT
from bert_jax.modeling.transformer import to_model_layout

ATOL = 1e-5
VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def randomize(torch_model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (biases and LayerNorms included), so a mis-mapped tensor cannot hide behind a zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            is_norm_scale = ("LayerNorm" in name or "layer_norm" in name) and name.endswith("weight")
            param.copy_(1.0 + 0.1 * noise if is_norm_scale else 0.1 * noise)
    return torch_model.eval()


def batch(pad_token_id: int = 0):
    """Two rows: one full, one padded; token types 0 then 1, as sentence pairs have."""
    rng = np.random.default_rng(0)
    input_ids = rng.integers(5, VOCAB, size=(2, 16)).astype(np.int64)
    attention_mask = np.ones_like(input_ids)
    attention_mask[1, 11:] = 0
    input_ids[1, 11:] = pad_token_id
    token_type_ids = np.zeros_like(input_ids)
    token_type_ids[:, 7:] = 1
    token_type_ids[1, 11:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def torch_outputs(torch_model, inputs, **kwargs):
    with torch.no_grad():
        return torch_model(**{k: torch.from_numpy(v) for k, v in inputs.items()}, output_hidden_states=True,
                           **kwargs)


def bert_jax_outputs(torch_model, model_config, flax_model_fn, head, inputs, scan_layers=False):
    """Convert the torch weights, then run the bert_jax model on the same inputs, compiled as a user's run is."""
    sd = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    params = state_dict.params_from_hf(sd, model_config, head)
    model_config.scan_layers = scan_layers
    params = to_model_layout(params, model_config)
    model = flax_model_fn(model_config)
    return as_users_compile(jax.jit(model.apply), {"params": params},
                            **{k: v.astype(np.int32) for k, v in inputs.items()})


def assert_close(ours, reference, mask=None):
    """ours == transformers' reference to ATOL. Logits over bert_jax's padded vocabulary (padded_vocab_size) have
    more columns: the real ones are compared, and the padding ones must hold MASKED_LOGIT."""
    ours, reference = np.asarray(ours), reference.detach().numpy()
    if ours.ndim == reference.ndim and ours.shape[-1] > reference.shape[-1]:
        np.testing.assert_array_equal(ours[..., reference.shape[-1]:], MASKED_LOGIT)
        ours = ours[..., :reference.shape[-1]]
    if mask is not None:  # compare real tokens only
        ours, reference = ours[mask > 0], reference[mask > 0]
    np.testing.assert_allclose(ours, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_bert_for_pretraining(scan_layers):
    hf = randomize(transformers.BertForPreTraining(transformers.BertConfig(**COMMON, attn_implementation="eager")))
    inputs = batch()
    ref = torch_outputs(hf, inputs)
    cfg = state_dict.config_from_hf(hf.config.to_dict())
    ours = bert_jax_outputs(hf, cfg, modeling.PreTrainingModel, "pretraining", inputs, scan_layers)
    mask = inputs["attention_mask"]
    assert_close(ours["last_hidden_state"], ref.hidden_states[-1], mask)
    assert_close(ours["pooler_output"], hf.bert.pooler(ref.hidden_states[-1]))
    assert_close(ours["mlm_logits"], ref.prediction_logits, mask)
    assert_close(ours["sentence_logits"], ref.seq_relationship_logits)


def test_roberta_for_masked_lm():
    hf = randomize(transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        **COMMON, type_vocab_size=1, pad_token_id=1, attn_implementation="eager")))
    inputs = batch(pad_token_id=1)
    inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
    ref = torch_outputs(hf, inputs)
    cfg = state_dict.config_from_hf(hf.config.to_dict(), pooler=False)
    ours = bert_jax_outputs(hf, cfg, lambda c: modeling.PreTrainingModel(c, sentence_head=False), "masked_lm", inputs)
    mask = inputs["attention_mask"]
    assert_close(ours["last_hidden_state"], ref.hidden_states[-1], mask)
    assert_close(ours["mlm_logits"], ref.logits, mask)


@pytest.mark.parametrize("num_hidden_groups,scan_layers", [(1, False), (1, True), (3, False)])
def test_albert_for_pretraining(num_hidden_groups, scan_layers):
    hf = randomize(transformers.AlbertForPreTraining(transformers.AlbertConfig(
        **COMMON, embedding_size=32, num_hidden_groups=num_hidden_groups, attn_implementation="eager")))
    inputs = batch()
    ref = torch_outputs(hf, inputs)
    cfg = state_dict.config_from_hf(hf.config.to_dict())
    ours = bert_jax_outputs(hf, cfg, modeling.PreTrainingModel, "pretraining", inputs, scan_layers)
    mask = inputs["attention_mask"]
    assert_close(ours["last_hidden_state"], ref.hidden_states[-1], mask)
    assert_close(ours["pooler_output"], hf.albert.pooler_activation(hf.albert.pooler(ref.hidden_states[-1][:, 0])))
    assert_close(ours["mlm_logits"], ref.prediction_logits, mask)
    assert_close(ours["sentence_logits"], ref.sop_logits)


def electra_config(**sizes):
    return transformers.ElectraConfig(**{**COMMON, **sizes}, embedding_size=32, attn_implementation="eager")


def test_electra_discriminator():
    hf = randomize(transformers.ElectraForPreTraining(electra_config()))
    inputs = batch()
    ref = torch_outputs(hf, inputs)
    cfg = state_dict.config_from_hf(hf.config.to_dict())
    ours = bert_jax_outputs(hf, cfg, modeling.ElectraDiscriminator, "discriminator", inputs)
    mask = inputs["attention_mask"]
    assert_close(ours["last_hidden_state"], ref.hidden_states[-1], mask)
    assert_close(ours["discriminator_logits"], ref.logits, mask)


def test_electra_generator():
    hf = randomize(transformers.ElectraForMaskedLM(electra_config(hidden_size=48, num_attention_heads=3,
                                                                  intermediate_size=96)))
    inputs = batch()
    ref = torch_outputs(hf, inputs)
    cfg = state_dict.config_from_hf(hf.config.to_dict())
    ours = bert_jax_outputs(hf, cfg, lambda c: modeling.PreTrainingModel(c, sentence_head=False), "generator", inputs)
    mask = inputs["attention_mask"]
    assert_close(ours["last_hidden_state"], ref.hidden_states[-1], mask)
    assert_close(ours["mlm_logits"], ref.logits, mask)


def test_gathered_mlm_head_equals_full_logits_at_those_positions():
    hf = randomize(transformers.BertForPreTraining(transformers.BertConfig(**COMMON, attn_implementation="eager")))
    inputs = batch()
    cfg = state_dict.config_from_hf(hf.config.to_dict())
    params = state_dict.params_from_hf({k: v.numpy() for k, v in hf.state_dict().items()}, cfg, "pretraining")
    model = modeling.PreTrainingModel(cfg)
    positions = np.array([[1, 4, 9], [0, 2, 10]], np.int32)
    full = model.apply({"params": params}, **inputs)["mlm_logits"]
    gathered = model.apply({"params": params}, **inputs, masked_positions=positions)["mlm_logits"]
    np.testing.assert_allclose(gathered, np.take_along_axis(np.asarray(full), positions[..., None], 1), atol=1e-6)
