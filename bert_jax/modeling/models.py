"""Heads, and the models built from the backbone: pretraining (MLM + NSP/SOP), ELECTRA, and fine-tuning."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bert_jax import families
from bert_jax.config_lib import generator_config, validate_model_config
from bert_jax.modeling.transformer import (ACTIVATIONS, POOLED, ROWS, Config, EncoderModel, Embeddings, constrain,
                                           dense, layer_norm, map_vocab_params, padded_vocab_size, param_dtype)

LOGITS = ("activation_batch", None, "activation_vocab")  # [B, P, V]: the vocabulary split over tensor
MASKED_LOGIT = -1e9  # the logit of a vocabulary padding column: finite in float32 and bfloat16, exp() of it is 0


def backbone(config: Config, **kwargs) -> nn.Module:
    """The encoder a family's models are built on: the shared one, or the family's own (families.Family.encoder)."""
    return (families.of(config).encoder or EncoderModel)(config, **kwargs)


def mlm_head(config: Config, **kwargs) -> nn.Module:
    """The family's masked-LM head: MlmHead, or the family's own (families.Family.mlm_head)."""
    return (families.of(config).mlm_head or MlmHead)(config, **kwargs)


class MlmHead(nn.Module):
    """dense H -> E, activation, LayerNorm, then logits tied to the word embeddings, plus a per-token bias.

    It projects the hidden states it is given: the backbone's at the masked positions [B, P, H] in pretraining
    (its output_positions), so that only those reach the vocabulary (the costly part).

    The logits (the models' "mlm_logits", ELECTRA's generator_logits) have padded_vocab_size(config) columns, so
    that a tensor-sharded vocabulary is never resliced; columns from vocab_size on hold MASKED_LOGIT. Objectives
    take them as they are; whatever hands logits to a user (pretrained.Pretrained) slices [..., :vocab_size].
    """

    config: Config

    @nn.compact
    def __call__(self, hidden, word_embeddings):
        cfg = self.config
        activation = families.of(cfg).mlm_activation or cfg.hidden_act
        x = dense(cfg, cfg.embedding_size, ("embed", "token_embed"), "transform")(constrain(hidden, ROWS))
        x = layer_norm(cfg, "token_embed", "norm")(ACTIVATIONS[activation](x))
        return vocab_logits(self, x, word_embeddings, cfg)


def vocab_logits(head: nn.Module, x, word_embeddings, config: Config):
    """Logits tied to the word embeddings plus the head's per-token `bias` (a parameter of `head`), in float32;
    the padding columns past vocab_size hold MASKED_LOGIT."""
    rows = padded_vocab_size(config)
    bias = head.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (rows,),
                      param_dtype(config))
    logits = constrain(jnp.einsum("...e,ve->...v", x, word_embeddings.astype(x.dtype)), LOGITS)
    logits = logits.astype(jnp.float32) + bias
    if rows == config.vocab_size:
        return logits
    # Padding columns: never sampled or predicted, and no gradient reaches their rows through the softmax.
    return jnp.where(jnp.arange(rows) < config.vocab_size, logits, MASKED_LOGIT)


class SentencePairHead(nn.Module):
    """Two-way classifier on the pooled [CLS] vector: next-sentence prediction (BERT) or sentence order (ALBERT)."""

    config: Config

    @nn.compact
    def __call__(self, pooled, deterministic: bool = True):
        pooled = nn.Dropout(self.config.hidden_dropout_prob)(constrain(pooled, POOLED), deterministic=deterministic)
        return dense(self.config, 2, ("embed", "classes"), "classifier")(pooled).astype(jnp.float32)


class DiscriminatorHead(nn.Module):
    """ELECTRA's per-token replaced/original logit: dense H -> H, activation, dense H -> 1."""

    config: Config

    @nn.compact
    def __call__(self, hidden):
        cfg = self.config
        x = ACTIVATIONS[cfg.hidden_act](dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense")(hidden))
        return dense(cfg, 1, ("mlp", "classes"), "prediction")(x)[..., 0].astype(jnp.float32)


class PreTrainingModel(nn.Module):
    """Backbone + MLM head, with the NSP/SOP head when `sentence_head` (BERT, ALBERT); RoBERTa has none.

    Also ELECTRA's generator on its own (generator_config(...), no sentence head), as HF's ElectraForMaskedLM.
    Given masked_positions [B, P], last_hidden_state and mlm_logits are at those positions only, which is all the
    backbone's last layer then computes (EncoderModel's output_positions).
    """

    config: Config
    sentence_head: bool = True

    def setup(self):
        self.backbone = backbone(self.config)
        self.mlm_head = mlm_head(self.config)
        if self.sentence_head:
            self.sentence_pair_head = SentencePairHead(self.config)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None,
                 packing_segment_ids=None, deterministic: bool = True):
        outputs = self.backbone(input_ids, attention_mask, token_type_ids, packing_segment_ids=packing_segment_ids,
                                output_positions=masked_positions, deterministic=deterministic)
        table = self.backbone.token_embeddings().word_embeddings.embedding
        outputs["mlm_logits"] = self.mlm_head(outputs["last_hidden_state"], table)
        if self.sentence_head:
            outputs["sentence_logits"] = self.sentence_pair_head(outputs["pooler_output"], deterministic)
        return outputs


class ElectraDiscriminator(nn.Module):
    """The ELECTRA model one keeps: backbone + per-token replaced-token logits (HF's ElectraForPreTraining)."""

    config: Config

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, packing_segment_ids=None,
                 deterministic: bool = True):
        outputs = backbone(self.config, name="backbone")(
            input_ids, attention_mask, token_type_ids, packing_segment_ids=packing_segment_ids,
            deterministic=deterministic)
        outputs["discriminator_logits"] = DiscriminatorHead(self.config, name="discriminator_head")(
            outputs["last_hidden_state"])
        return outputs


class Electra(nn.Module):
    """Generator and discriminator for replaced-token detection, sharing one Embeddings module.

    The objective calls `generator_logits`, samples replacements, then `discriminator_logits`; `__call__` runs
    both on the same input only so that `init` creates every parameter.
    """

    config: Config

    def setup(self):
        cfg = self.config
        gen_cfg = generator_config(cfg)
        self.embeddings = Embeddings(cfg)
        self.generator = backbone(gen_cfg, shared_embeddings=self.embeddings)
        self.generator_head = mlm_head(gen_cfg)
        self.discriminator = backbone(cfg, shared_embeddings=self.embeddings)
        self.discriminator_head = DiscriminatorHead(cfg)

    def generator_logits(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None,
                         packing_segment_ids=None, deterministic: bool = True):
        hidden = self.generator(input_ids, attention_mask, token_type_ids, packing_segment_ids=packing_segment_ids,
                                output_positions=masked_positions, deterministic=deterministic)["last_hidden_state"]
        return self.generator_head(hidden, self.embeddings.word_embeddings.embedding)

    def discriminator_logits(self, input_ids, attention_mask=None, token_type_ids=None, packing_segment_ids=None,
                             deterministic: bool = True):
        hidden = self.discriminator(input_ids, attention_mask, token_type_ids,
                                    packing_segment_ids=packing_segment_ids,
                                    deterministic=deterministic)["last_hidden_state"]
        return self.discriminator_head(hidden)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, masked_positions=None,
                 deterministic: bool = True):
        return {
            "mlm_logits": self.generator_logits(input_ids, attention_mask, token_type_ids, masked_positions,
                                                deterministic=deterministic),
            "discriminator_logits": self.discriminator_logits(input_ids, attention_mask, token_type_ids,
                                                              deterministic=deterministic),
        }


class SequenceClassifier(nn.Module):
    """[CLS] -> num_labels logits (num_labels=1 regresses). Uses the pooler when the family has one; ELECTRA,
    which has none, gets dense + GELU on [CLS] first, as in its paper's fine-tuning head. [CLS] is the one row read,
    so the backbone's last layer computes it alone (EncoderModel's output_positions); last_hidden_state is [B, 1, H]."""

    config: Config
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, deterministic: bool = True):
        cfg = self.config
        outputs = backbone(cfg, name="backbone")(input_ids, attention_mask, token_type_ids,
                                                     output_positions=jnp.zeros_like(input_ids[:, :1]),
                                                     deterministic=deterministic)
        if cfg.pooler:
            features = outputs["pooler_output"]
        else:
            features = ACTIVATIONS["gelu"](dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense")(
                outputs["last_hidden_state"][:, 0]))
        features = nn.Dropout(cfg.hidden_dropout_prob)(features, deterministic=deterministic)
        outputs["logits"] = dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(features).astype(
            jnp.float32)
        return outputs


class SpanExtractor(nn.Module):
    """Extractive QA: per-token start and end logits over "[CLS] question [SEP] passage [SEP]"."""

    config: Config

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, deterministic: bool = True):
        outputs = backbone(self.config, name="backbone")(input_ids, attention_mask, token_type_ids,
                                                             deterministic=deterministic)
        logits = dense(self.config, 2, ("embed", "classes"), "span_classifier")(outputs["last_hidden_state"])
        outputs["start_logits"], outputs["end_logits"] = jnp.moveaxis(logits.astype(jnp.float32), -1, 0)
        return outputs


# What sits on the backbone: the one word for it everywhere (load_pretrained, exports, HF tables).
#   backbone       the encoder alone (any checkpoint's)
#   pretraining    MLM + NSP/SOP heads (BERT, ALBERT)
#   masked_lm      MLM head only (BERT, RoBERTa, ALBERT)
#   discriminator  ELECTRA's replaced-token detector
#   generator      ELECTRA's MLM generator (a masked_lm model with the generator's config)
#   both           ELECTRA's generator and discriminator, sharing their embeddings
HEADS = ("backbone", "pretraining", "masked_lm", "discriminator", "generator", "both")
# The head each objective trains (contrastive: bert_jax.embed_train, whose checkpoints hold the backbone alone).
HEAD_OF_OBJECTIVE = {"mlm_nsp": "pretraining", "mlm_sop": "pretraining", "mlm": "masked_lm", "rtd": "both",
                     "contrastive": "backbone"}


def objective_head(objective: str, model: Config) -> str | None:
    """The head `objective` trains on this model (None for an unknown objective); with a family whose masked-LM
    model is a generator (ELECTRA), "generator"."""
    head = HEAD_OF_OBJECTIVE.get(objective)
    return "generator" if head == "masked_lm" and families.of(model).has_generator else head


def model_for_head(model: Config, head: str) -> nn.Module:
    """The module whose parameters a checkpoint with this head fills."""
    if head == "both":
        return Electra(model)
    if head == "backbone":
        return backbone(model)
    if head == "discriminator":
        return ElectraDiscriminator(model)
    return PreTrainingModel(model, sentence_head=head == "pretraining")


def pretraining_model(config) -> nn.Module:
    """The model `config.objective` trains: MLM+NSP / MLM+SOP / MLM / RTD."""
    validate_model_config(config.model, needs_generator=config.objective == "rtd")
    return model_for_head(config.model, HEAD_OF_OBJECTIVE[config.objective])


def dummy_inputs(batch_size: int = 1, seq_length: int = 8) -> dict:
    """Inputs of the right shapes and dtypes for `init` and `eval_shape`."""
    ids = jnp.zeros((batch_size, seq_length), jnp.int32)
    return {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": ids}


def abstract_params(model: nn.Module, **inputs):
    """The parameter pytree as ShapeDtypeStructs (boxed with logical axis names); allocates nothing."""
    inputs = inputs or dummy_inputs()
    return jax.eval_shape(model.init, jax.random.key(0), **inputs)["params"]


def init_params(model: nn.Module, rng, **inputs):
    """Randomly initialised parameters as a plain pytree of float32 arrays, from one compiled program that computes
    nothing else: run op by op, `init` compiled each initializer and each op of the forward pass on its own (51
    compiles of `normal` alone in tests/test_mixed_precision.py) and ran the forward pass too."""
    return jax.jit(lambda rng, inputs: nn.unbox(model.init(rng, **inputs)["params"]))(rng, inputs or dummy_inputs())


def count_params(params, config: Config) -> int:
    """Parameters in a (boxed or plain) pytree, the vocabulary padding rows left out (see padded_vocab_size), so
    that counts match the papers' and transformers'."""
    params = map_vocab_params(nn.unbox(params), lambda x: jax.ShapeDtypeStruct(
        (min(x.shape[0], config.vocab_size), *x.shape[1:]), x.dtype))
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(params)))
