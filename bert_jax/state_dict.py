"""PyTorch (HF transformers) state dicts <-> bert_jax parameter pytrees, for every family (bert_jax/families).

One table of (HF module name, bert_jax module path, kind) per family and head says where every tensor goes; the kind
says how its layout changes (PyTorch Linear stores [out, in]; attention kernels here are [in, heads, head_dim]).
Import and export read the same table, so they cannot drift apart.

Heads (modeling.HEADS; the HF class that matches is in each family's file, families.HfNames.architectures):
  backbone       BertModel / RobertaModel / AlbertModel / ElectraModel      -> the backbone's params
  pretraining    BertForPreTraining / AlbertForPreTraining                  -> PreTrainingModel(sentence_head=True)
  masked_lm      Bert/Roberta/AlbertForMaskedLM                             -> PreTrainingModel(sentence_head=False)
  generator      ElectraForMaskedLM                                         -> PreTrainingModel(sentence_head=False)
  discriminator  ElectraForPreTraining                                      -> ElectraDiscriminator
  both           ElectraForPreTraining + ElectraForMaskedLM (two files)     -> Electra (generator and discriminator)
"""
from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
from flax import linen as nn
from flax import traverse_util

from bert_jax import config_lib, families, modeling
from bert_jax.errors import UserError
from bert_jax.modeling.transformer import has_embedding_projection, pad_vocab, unpad_vocab

# Tensors HF keeps tied to others (or as buffers); present in some files, absent in others, never information.
DERIVED_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids", "predictions.decoder.weight",
                    "predictions.decoder.bias", "lm_head.decoder.weight", "lm_head.decoder.bias",
                    "generator_lm_head.weight")
# HF parameter names inside each kind of module, with the bert_jax name each becomes.
KIND_PARAMS = {
    "linear": (("weight", "kernel"), ("bias", "bias")),
    "qkv": (("weight", "kernel"), ("bias", "bias")),
    "attention_output": (("weight", "kernel"), ("bias", "bias")),
    "layer_norm": (("weight", "scale"), ("bias", "bias")),
    "embedding": (("weight", "embedding"),),
    "vector": (("", "bias"),),
}


class ConversionError(UserError, ValueError):
    """The checkpoint does not fit the model; the message lists the tensors concerned."""


class LoadError(UserError, ValueError):
    """A checkpoint that cannot be read, or a task load_pretrained cannot give; the message names the file (and
    step) and what would work. Defined here, below pretrained and tf_checkpoint, so that both can raise it."""


def backbone_modules(model: config_lib.ml_collections.ConfigDict, hf_base: str, ours: str) -> list:
    """(HF module, bert_jax module path, kind) for embeddings, projection, layers and pooler."""
    hf = families.of(model).hf
    join = lambda *parts: ".".join(p for p in parts if p)
    root = f"{ours}/" if ours else ""
    modules = [(join(hf_base, f"embeddings.{n}_embeddings"), f"{root}embeddings/{n}_embeddings", "embedding")
               for n in ("word", "position", "token_type")]
    modules.append((join(hf_base, "embeddings.LayerNorm"), f"{root}embeddings/norm", "layer_norm"))
    if has_embedding_projection(model):
        modules.append((join(hf_base, hf.embedding_projection), f"{root}embedding_projection", "linear"))
    for index in range(model.num_hidden_groups):  # one per layer unless layers are shared (ALBERT)
        layer = join(hf_base, hf.layer.format(index=index))
        modules += [(f"{layer}.{name}", f"{root}encoder/layer_{index}/{module}", LAYER_KINDS[module])
                    for module, name in hf.layer_modules.items()]
    if model.pooler:
        modules.append((join(hf_base, hf.pooler), f"{root}pooler", "linear"))
    return modules


LAYER_KINDS = {"query": "qkv", "key": "qkv", "value": "qkv", "attention_output": "attention_output",
               "attention_norm": "layer_norm", "intermediate": "linear", "output": "linear",
               "output_norm": "layer_norm"}


def available_heads(family: str) -> tuple[str, ...]:
    """The heads whose tensors a family's HF files hold (ELECTRA's masked_lm is its generator's file)."""
    return tuple(head for head in families.get(family).heads if head in ARCHITECTURE_HEADS)


def head_modules(family: str, head: str) -> list:
    """(HF module, bert_jax module path, kind) for the head on top of the backbone."""
    if head not in available_heads(family):
        raise ConversionError(f"{family} has no {head!r} head; choose one of {available_heads(family)}")
    hf = families.get(family).hf
    if head == "backbone":
        return []
    if head == "discriminator":
        dense, prediction = hf.discriminator
        return [(dense, "discriminator_head/dense", "linear"), (prediction, "discriminator_head/prediction", "linear")]
    transform, norm, bias = hf.mlm
    mlm = [(transform, "mlm_head/transform", "linear"), (norm, "mlm_head/norm", "layer_norm"),
           (bias, "mlm_head", "vector")]
    if head == "pretraining":
        return mlm + [(hf.sentence_pair, "sentence_pair_head/classifier", "linear")]
    return mlm  # masked_lm, and ELECTRA's generator


def tensor_pairs(model, head: str, hf_base: str) -> Iterator[tuple[str, str, str]]:
    """Every (HF tensor name, bert_jax parameter path, kind) of a model with this head."""
    custom = families.of(model).hf_conversion
    if custom is not None:
        yield from custom.tensor_pairs(model, head, hf_base)
        return
    ours = "" if head == "backbone" else "backbone"
    for hf_module, our_module, kind in backbone_modules(model, hf_base, ours) + head_modules(model.family, head):
        for hf_param, our_param in KIND_PARAMS[kind]:
            hf_name = f"{hf_module}.{hf_param}" if hf_param else hf_module
            yield hf_name, f"{our_module}/{our_param}", f"{kind}.{our_param}"


def _to_ours(array: np.ndarray, kind: str, model) -> np.ndarray:
    custom = families.of(model).hf_conversion
    if custom is not None:
        return custom.to_ours(array, kind, model)
    heads = model.num_attention_heads
    if kind == "linear.kernel":
        return array.T
    if kind == "qkv.kernel":
        return array.T.reshape(array.shape[1], heads, -1)
    if kind == "qkv.bias":
        return array.reshape(heads, -1)
    if kind == "attention_output.kernel":
        return array.T.reshape(heads, -1, array.shape[0])
    return array


def _to_hf(array: np.ndarray, kind: str, model) -> np.ndarray:
    custom = families.of(model).hf_conversion
    if custom is not None:
        return custom.to_hf(array, kind, model)
    if kind == "linear.kernel":
        return array.T
    if kind == "qkv.kernel":
        return array.reshape(array.shape[0], -1).T
    if kind == "qkv.bias":
        return array.reshape(-1)
    if kind == "attention_output.kernel":
        return array.reshape(-1, array.shape[-1]).T
    return array


def detect_base_prefix(names, family: str) -> str:
    """'' for a bare backbone file (BertModel.save_pretrained), else the family's prefix; a clear error if the
    tensors belong to another family."""
    prefixes = {name.split(".", 1)[0] for name in names}
    base = families.get(family).hf.base_prefix
    if base in prefixes:
        return base
    others = [f for f in families.names() if f != family and families.get(f).hf.base_prefix in prefixes]
    if others:
        raise ConversionError(f"this is a {others[0]} checkpoint (tensors start with "
                              f"'{families.get(others[0]).hf.base_prefix}.'), but the config says family={family!r}; "
                              f"use the {others[0]} config")
    return ""


def _describe(names, limit: int = 12) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def params_from_hf(state_dict: Mapping[str, np.ndarray], model, head: str):
    """bert_jax params (unscanned layout, float32 numpy) from an HF state dict; errors list every missing,
    unexpected or mis-shaped tensor. The vocab_size-row tensors are padded to the model's padded_vocab_size."""
    config_lib.validate_model_config(model)
    hf_base = detect_base_prefix(state_dict, model.family)
    pairs = list(tensor_pairs(model, head, hf_base))
    expected = {hf for hf, _, _ in pairs}
    missing = expected - set(state_dict)
    custom = families.of(model).hf_conversion
    derived = DERIVED_SUFFIXES + (custom.derived_suffixes if custom else ())
    unexpected = {n for n in state_dict if n not in expected and not n.endswith(derived)}
    if missing or unexpected:
        raise ConversionError(
            f"the checkpoint does not match a {model.family} {head} model"
            + (f"; missing tensors: {_describe(missing)}" if missing else "")
            + (f"; unexpected tensors: {_describe(unexpected)}" if unexpected else "")
            + ". Check the family and head, and the sizes in the config.")
    flat = {tuple(ours.split("/")): _to_ours(np.asarray(state_dict[hf], np.float32), kind, model)
            for hf, ours, kind in pairs}
    params = pad_vocab(traverse_util.unflatten_dict(flat), model)
    check_shapes(params, modeling.abstract_params(modeling.model_for_head(model, head)))
    return params


def params_to_hf(params, model, head: str, hf_base: str | None = None) -> dict[str, np.ndarray]:
    """The HF state dict (without tied copies) of bert_jax params in the unscanned layout; the vocabulary
    tensors cut back to vocab_size rows, as HF has them."""
    flat = traverse_util.flatten_dict(unpad_vocab(params, model), sep="/")
    hf_base = families.of(model).hf.base_prefix if hf_base is None else hf_base
    return {hf: np.ascontiguousarray(_to_hf(np.asarray(flat[ours], np.float32), kind, model))
            for hf, ours, kind in tensor_pairs(model, head, hf_base)}


def check_shapes(params, reference) -> None:
    """Raise ConversionError naming every parameter whose shape differs from `reference` (e.g. abstract params)."""
    got = traverse_util.flatten_dict(params, sep="/")
    want = traverse_util.flatten_dict(nn.unbox(reference), sep="/")
    wrong = [f"{k}: checkpoint {tuple(got[k].shape)} vs model {tuple(want[k].shape)}"
             for k in want if k in got and tuple(got[k].shape) != tuple(want[k].shape)]
    absent = set(want) ^ set(got)
    if wrong or absent:
        raise ConversionError("parameter shapes do not match the config: "
                              + "; ".join(wrong + [f"{k}: present in only one" for k in sorted(absent)]))


def detect_head(names, family: str) -> str:
    """The richest head whose tensors a state dict holds (e.g. 'pretraining' for BertForPreTraining)."""
    def holds(module: str) -> bool:
        return any(name == module or name.startswith(module + ".") for name in names)

    for head in ("pretraining", "discriminator", "masked_lm", "generator"):
        if head in available_heads(family) and all(holds(module) for module, _, _ in head_modules(family, head)):
            return head
    return "backbone"


def has_pooler(names) -> bool:
    """Whether a state dict holds the backbone's pooler (RobertaForMaskedLM and ELECTRA files have none)."""
    return any("pooler" in name.split(".") for name in names)


def electra_parts(params) -> dict:
    """The discriminator (ElectraDiscriminator) and generator (PreTrainingModel) params inside joint Electra
    params; both halves see the one shared embeddings module."""
    def part(encoder, head_name, head):
        return {"backbone": {"embeddings": params["embeddings"], **params[encoder]}, head_name: params[head]}

    return {"discriminator": part("discriminator", "discriminator_head", "discriminator_head"),
            "generator": part("generator", "mlm_head", "generator_head")}


def electra_params_from_hf(discriminator_state: Mapping, generator_state: Mapping, model):
    """Joint Electra params from an ElectraForPreTraining and an ElectraForMaskedLM state dict.

    ELECTRA trains both halves on one embeddings table, so differing embeddings mean the two files do not belong
    together (the classic mix-up); that is an error naming the tensors.
    """
    discriminator = params_from_hf(discriminator_state, model, "discriminator")
    generator = params_from_hf(generator_state, config_lib.generator_config(model), "generator")
    disc_backbone, gen_backbone = dict(discriminator["backbone"]), dict(generator["backbone"])
    embeddings = traverse_util.flatten_dict(disc_backbone.pop("embeddings"), sep="/")
    gen_embeddings = traverse_util.flatten_dict(gen_backbone.pop("embeddings"), sep="/")
    differing = [k for k, v in embeddings.items() if not np.array_equal(v, gen_embeddings[k])]
    if differing:
        raise ConversionError(f"the generator's and the discriminator's embeddings differ ({_describe(differing)}); "
                              "ELECTRA shares them, so these are not two halves of one checkpoint")
    return {"embeddings": traverse_util.unflatten_dict(embeddings, sep="/"), "generator": gen_backbone,
            "generator_head": generator["mlm_head"], "discriminator": disc_backbone,
            "discriminator_head": discriminator["discriminator_head"]}


def electra_params_to_hf(params, model) -> dict[str, dict[str, np.ndarray]]:
    """{"discriminator": ElectraForPreTraining state dict, "generator": ElectraForMaskedLM state dict}."""
    parts = electra_parts(params)
    return {"discriminator": params_to_hf(parts["discriminator"], model, "discriminator"),
            "generator": params_to_hf(parts["generator"], config_lib.generator_config(model), "generator")}


HF_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                  "type_vocab_size", "layer_norm_eps", "initializer_range", "embedding_size", "num_hidden_groups",
                  "pad_token_id")
# The heads one HF file holds (ELECTRA's "both" is two files: a discriminator and a generator).
ARCHITECTURE_HEADS = ("backbone", "pretraining", "masked_lm", "discriminator", "generator")


def config_to_hf(model, head: str, special=None) -> dict:
    """The HF config.json dict of a bert_jax model config with this head (the inverse of config_from_hf), with the
    special-token ids of `special` (a tokenizer's SpecialIds) where HF's config class holds them."""
    custom = families.of(model).hf_conversion
    hf = _hf_config_keys(model, head) if custom is None else custom.config_to_hf(model, head)
    return {**hf, **special_token_ids(model, special)}


# HF's bos/cls token opens a sequence as [CLS] does, its eos/sep token closes it as [SEP] does.
SPECIAL_TOKEN_ROLES = {"bos_token_id": "cls", "cls_token_id": "cls", "eos_token_id": "sep", "sep_token_id": "sep"}


def special_token_ids(model, special=None) -> dict:
    """config.json's special-token ids: the tokenizer's (`special`), else the released vocabulary's where this
    vocabulary holds them, else None. Left to HF's defaults, a smaller vocabulary would get ids outside it."""
    released = families.of(model).hf.special_token_ids
    if special is not None:
        return {key: getattr(special, SPECIAL_TOKEN_ROLES[key]) for key in released}
    return {key: token_id if token_id < model.vocab_size else None for key, token_id in released.items()}


def _hf_config_keys(model, head: str) -> dict:
    """The config.json of a family that follows the shared encoder's tables."""
    family = families.of(model)
    if "embedding_size" in family.hf.config_drops and model.embedding_size != model.hidden_size:
        raise ConversionError(f"HF's {family.name} has no embedding projection; embedding_size={model.embedding_size} "
                              f"must equal hidden_size={model.hidden_size} to export")
    if head not in available_heads(family.name):
        raise ConversionError(f"{family.name} has no {head!r} head; choose one of {available_heads(family.name)}")
    hf = {key: model[key] for key in HF_CONFIG_KEYS if key not in family.hf.config_drops}
    hf.update(family.hf.config_extra, model_type=family.name, architectures=[family.hf.architectures[head]],
              position_embedding_type="absolute")
    return hf


def config_from_hf(hf_config: Mapping, pooler: bool | None = None):
    """A bert_jax model config from an HF config.json dict. `pooler` defaults to whether the family has one."""
    family = hf_config.get("model_type")
    if family not in families.names():
        raise ConversionError(f"config.json has model_type={family!r}; bert_jax reads {families.names()}")
    custom = families.get(family).hf_conversion
    if custom is not None:
        return config_lib.model_config(family, **custom.sizes_from_hf(hf_config))
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"position_embedding_type={hf_config['position_embedding_type']!r} is not supported; "
                              "only absolute position embeddings")
    if hf_config.get("inner_group_num", 1) != 1:
        raise ConversionError("ALBERT with inner_group_num != 1 is not supported (no released model uses it)")
    sizes = {k: hf_config[k] for k in HF_CONFIG_KEYS if hf_config.get(k) is not None}
    sizes["pooler"] = families.get(family).hf.pooler is not None if pooler is None else pooler
    return config_lib.model_config(family, **sizes)
