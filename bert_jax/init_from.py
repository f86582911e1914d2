"""Continued pretraining: the trainer's parameters start from a checkpoint (config.init_from); nothing else does.

`resolve` reads the checkpoint once, on the CPU, and gives the config the checkpoint's architecture and tokenizer,
checking before anything is built that the objective, the vocabulary and the sequence length fit it. After the
trainer has initialised its state, `initial_params` puts the checkpoint's tensors into the parameters, leaf by leaf
in the trainer's own layout and sharding. What the checkpoint lacks (a head, ELECTRA's generator) or
config.init_exclude names keeps its random initialisation, and a one-line report says so. The optimizer, the step
and the data start afresh.
"""
from __future__ import annotations

import re

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import linen as nn
from flax import traverse_util

from bert_jax import config_lib, families, modeling, state_dict, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import tokenizers as tokenizer_lib
from bert_jax.modeling.transformer import to_model_layout
from bert_jax.pretrained import Pretrained, host_params, load_pretrained, max_tokens
from bert_jax.workdir import EXECUTION_KEYS

# Model keys the training config decides whatever the checkpoint says: how the model computes (the parameters stay
# valid), dropout, and whether there is a pooler (the sentence-pair head needs one; it starts random if missing).
TRAINING_KEYS = (*EXECUTION_KEYS, "param_dtype", "scan_layers", "hidden_dropout_prob",
                 "attention_probs_dropout_prob", "pooler")
# The checkpoint heads each trainer model starts from (see trainer_tree): any encoder for the MLM objectives; for
# ELECTRA's rtd a generator + discriminator pair, or a discriminator whose generator then starts random.
STARTS_FROM = {"pretraining": ("pretraining", "masked_lm", "discriminator", "backbone"),
               "masked_lm": ("pretraining", "masked_lm", "discriminator", "backbone"),
               "both": ("both", "discriminator", "backbone")}
# The files of each tokenizer kind that the input pipeline reads (it takes no tokenizer.json).
PIPELINE_TOKENIZER_FILES = {"wordpiece": "vocab.txt", "bpe": "vocab.json", "sentencepiece": "*.model"}


class InitFromError(UserError, ValueError):
    """config.init_from cannot start this training config; the message names the key and what to do."""


def resolve(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, Pretrained | None]:
    """(config, None) when config.init_from is empty. Else (a locked copy of the config with the checkpoint's
    architecture and, when the checkpoint ships one, its tokenizer; the loaded checkpoint, on the CPU)."""
    if not config.init_from:
        return config, None
    pretrained = load_pretrained(config.init_from)
    check_starts_from(config, pretrained)
    resolved = ml_collections.ConfigDict(config.to_dict())
    resolved.model = checkpoint_model(config, pretrained)
    config_lib.validate_model_config(resolved.model, needs_generator=config.objective == "rtd")
    tokenizer = pipeline_tokenizer(pretrained.tokenizer)
    if tokenizer is None:
        logging.warning("config.init_from=%s ships no tokenizer the input pipeline reads (%s); training tokenizes "
                        "with config.data.tokenizer_path=%s, which must be the checkpoint's vocabulary",
                        config.init_from, ", ".join(PIPELINE_TOKENIZER_FILES.values()), config.data.tokenizer_path)
    else:
        resolved.data.update(tokenizer)
    check_vocabulary(resolved)
    check_seq_length(resolved)
    if config.init_exclude:
        excluded_paths(parameter_paths(resolved), config.init_exclude)
    return config_lib.lock(resolved), pretrained


def check_starts_from(config: ml_collections.ConfigDict, pretrained: Pretrained) -> None:
    """The checkpoint is of the config's family and holds what the objective's model is built around."""
    family, have = pretrained.config.family, pretrained.head
    if family != config.model.family:
        raise InitFromError(f"the config is a {config.model.family} config (configs/{config.model.family}.py) but "
                            f"config.init_from={config.init_from} is a {family} checkpoint: use configs/{family}.py")
    want = modeling.HEAD_OF_OBJECTIVE[config.objective]
    if have not in STARTS_FROM[want]:
        hint = (": pass the discriminator (an ElectraForPreTraining folder) or a folder with discriminator/ and "
                "generator/" if have == "generator" else "")
        raise InitFromError(f"config.objective={config.objective!r} trains a {want!r} model, which cannot start from "
                            f"the {have!r} model in config.init_from={config.init_from}; it starts from "
                            f"{', '.join(STARTS_FROM[want])}{hint}")


def checkpoint_model(config: ml_collections.ConfigDict, pretrained: Pretrained) -> ml_collections.ConfigDict:
    """The checkpoint's architecture with the config's TRAINING_KEYS; ELECTRA's generator sizes are the checkpoint's
    when it holds a generator, else the config's (that generator starts random)."""
    model = ml_collections.ConfigDict(pretrained.config.to_dict())
    model.update({key: config.model[key] for key in TRAINING_KEYS})
    if config.objective == "rtd" and pretrained.head != "both":
        model.generator = ml_collections.ConfigDict(config.model.generator.to_dict())
    return model


def pipeline_tokenizer(tokenizer: tokenizer_lib.Tokenizer | None) -> dict | None:
    """config.data's tokenizer keys for a checkpoint's tokenizer, naming the files the input pipeline reads (a
    tokenizer.json's folder usually has them too); None when there are none."""
    if tokenizer is None:
        return None
    path = storage.as_path(tokenizer.path)
    if path.name == "tokenizer.json":
        found = sorted(path.parent.glob(PIPELINE_TOKENIZER_FILES[tokenizer.kind]))
        if not found:
            return None
        path = path.parent if tokenizer.kind == "bpe" else found[0]
    # Whether the tokenizer folds case: what config.data.lowercase tells the pipeline's WordPiece.
    lowercase = tokenizer.encode("The") == tokenizer.encode("the")
    return dict(tokenizer_kind=tokenizer.kind, tokenizer_path=str(path), lowercase=lowercase)


def check_vocabulary(config: ml_collections.ConfigDict) -> None:
    """Every id the training tokenizer gives must have a row in the checkpoint's embeddings."""
    data = config.data
    if not data.tokenizer_path:
        return  # the input pipeline names this key itself
    tokenizer = tokenizer_lib.load_tokenizer(data.tokenizer_kind, input_config.resolve_path(data.tokenizer_path),
                                             data.lowercase)
    if tokenizer.vocab_size > config.model.vocab_size:
        raise InitFromError(f"config.data.tokenizer_path={data.tokenizer_path} has {tokenizer.vocab_size} ids but "
                            f"config.init_from={config.init_from} has {config.model.vocab_size} word embeddings: set "
                            "config.data.tokenizer_path to the checkpoint's own tokenizer (vocab.txt, vocab.json + "
                            "merges.txt or *.model)")


def check_seq_length(config: ml_collections.ConfigDict) -> None:
    """The training sequences must fit the checkpoint's position table."""
    positions = max_tokens(config.model)
    family = families.of(config.model)
    offset = f" ({family.title}'s start after pad_token_id + 1)" if family.position_offset else ""
    if config.data.seq_length > positions:
        raise InitFromError(f"config.data.seq_length={config.data.seq_length} is longer than the {positions} "
                            f"positions of config.init_from={config.init_from}"
                            + offset + f"; set config.data.seq_length <= {positions}")


def parameter_paths(config: ml_collections.ConfigDict) -> list[str]:
    """The '/'-joined parameter paths of the model the trainer builds (shapes only; nothing is allocated)."""
    abstract = nn.unbox(modeling.abstract_params(modeling.pretraining_model(config)))
    return list(traverse_util.flatten_dict(abstract, sep="/"))


def excluded_paths(paths, pattern: str) -> list[str]:
    """The paths config.init_exclude matches (re.search), in their order; a pattern that is no regex or matches
    nothing is an error, since it would silently load everything."""
    if not pattern:
        return []
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise InitFromError(f"config.init_exclude={pattern!r} is not a regular expression ({e})") from e
    matched = [path for path in paths if regex.search(path)]
    if not matched:
        raise InitFromError(f"config.init_exclude={pattern!r} matches no parameter; the paths look like "
                            f"{', '.join(sorted(paths)[:3])}")
    return matched


# ------------------------------------------------------------------------------------------------------------------


def initial_params(params, pretrained: Pretrained, config: ml_collections.ConfigDict) -> tuple[dict, str]:
    """`params` (the trainer's fresh ones, in its layout and sharding) with the checkpoint's tensors wherever the
    checkpoint has them and config.init_exclude does not match; and a one-line report of what was loaded, what was
    initialized and what in the checkpoint was left unused."""
    source = checkpoint_leaves(pretrained, config)
    target = traverse_util.flatten_dict(params, sep="/")
    excluded = excluded_paths(target, config.init_exclude)
    kept_random = set(excluded)
    loaded = [path for path in target if path in source and path not in kept_random]
    loaded_set = set(loaded)
    state_dict.check_shapes(traverse_util.unflatten_dict({p: source[p] for p in loaded}, sep="/"),
                            traverse_util.unflatten_dict({p: target[p] for p in loaded}, sep="/"))
    merged = {**target, **{path: placed_like(source[path], target[path]) for path in loaded}}
    absent = [path for path in target if path not in source and path not in kept_random]
    initialized = [f"{describe(absent, target)} (not in the checkpoint)"] if absent else []
    initialized += [f"{describe(excluded, target)} (init_exclude)"] if excluded else []
    unused = [path for path in source if path not in loaded_set]  # not in the model, or excluded
    report = (f"init_from {config.init_from} ({pretrained.config.family} {pretrained.head}): loaded "
              f"{describe(loaded, target)} ({len(loaded)} tensors); initialized {', '.join(initialized) or 'nothing'}"
              f"; unused from the checkpoint: {describe(unused, source)}"
              + (f" ({len(unused)} tensors)" if unused else ""))
    return traverse_util.unflatten_dict(merged, sep="/"), report


def checkpoint_leaves(pretrained: Pretrained, config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by '/'-joined path in the trainer's model and layout (stacked layers with
    scan_layers), on the host."""
    tree = trainer_tree(host_params(pretrained), pretrained.head, modeling.HEAD_OF_OBJECTIVE[config.objective])
    with jax.default_device(jax.devices("cpu")[0]):  # to_model_layout stacks layers with jnp
        tree = jax.device_get(to_model_layout(tree, config.model))
    return traverse_util.flatten_dict(tree, sep="/")


def trainer_tree(params: dict, have: str, want: str) -> dict:
    """A checkpoint's params (head `have`) named as in the trainer's model (head `want`); what that model lacks
    keeps its own name, and is reported unused. ELECTRA's discriminator backbone splits into the embeddings the
    generator shares and the discriminator's encoder (the inverse of state_dict.electra_parts)."""
    if have == "backbone":
        params = {"backbone": params}
    if want != "both" or have == "both":
        return params
    backbone = dict(params["backbone"])
    return {"embeddings": backbone.pop("embeddings"), "discriminator": backbone,
            **{name: value for name, value in params.items() if name != "backbone"}}


def placed_like(value: np.ndarray, leaf: jax.Array) -> jax.Array:
    """`value` as `leaf` is: its dtype, and its sharding (each process places the shards it holds)."""
    value = np.asarray(value, leaf.dtype)
    return jax.make_array_from_callback(value.shape, leaf.sharding, lambda index: value[index])


def describe(paths, universe) -> str:
    """`paths` in few words: the shortest path prefixes that cover them and nothing else of `universe` (e.g.
    'mlm_head' for all of its tensors)."""
    chosen, universe = set(paths), list(universe)

    def pure(prefix: str) -> bool:
        return all(p in chosen for p in universe if p == prefix or p.startswith(prefix + "/"))

    groups = []
    for path in paths:
        parts = path.split("/")
        group = next("/".join(parts[:i]) for i in range(1, len(parts) + 1) if pure("/".join(parts[:i])))
        if group not in groups:
            groups.append(group)
    return ", ".join(groups) or "nothing"
