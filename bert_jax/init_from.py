"""Continued pretraining: the trainer's parameters start from a checkpoint (config.init_from); nothing else does.

`resolve` reads the checkpoint once, on the CPU, and gives the config the checkpoint's architecture and tokenizer,
checking before anything is built that the objective, the vocabulary and the sequence length fit it. After the
trainer has initialised its state, `initial_params` puts the checkpoint's tensors into the parameters, leaf by leaf
in the trainer's own layout and sharding. What the checkpoint lacks (a head, ELECTRA's generator) or
config.init_exclude names keeps its random initialisation, and a one-line report says so. The step and the data
start afresh; so does the optimizer, unless config.init_from_optimizer carries a bert_jax workdir's moments into
the new phase (its schedule restarted).

A new phase may train on longer sequences than the checkpoint's position table holds: the table then grows by
copying its learned rows over the new positions, as Longformer did (its optimizer moments likewise).
"""
from __future__ import annotations

import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import linen as nn
from flax import traverse_util

from bert_jax import checkpoints, config_lib, families, modeling, state_dict, storage
from bert_jax import optimizer as optimizer_lib
from bert_jax.errors import UserError
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import tokenizers as tokenizer_lib
from bert_jax.modeling.transformer import to_model_layout
from bert_jax.pretrained import Pretrained, host_params, load_pretrained, workdir_and_step
from bert_jax.workdir import CONFIG_FILE, EXECUTION_KEYS

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
    if config.init_from_optimizer:
        check_carried_optimizer(config)
    resolved = ml_collections.ConfigDict(config.to_dict())
    resolved.model = checkpoint_model(config, pretrained)
    resolved.model.max_position_embeddings = position_rows(resolved.model, config.data.seq_length)
    config_lib.validate_model_config(resolved.model, needs_generator=config.objective == "rtd")
    tokenizer = pipeline_tokenizer(pretrained.tokenizer)
    if tokenizer is None:
        logging.warning("config.init_from=%s ships no tokenizer the input pipeline reads (%s); training tokenizes "
                        "with config.data.tokenizer_path=%s, which must be the checkpoint's vocabulary",
                        config.init_from, ", ".join(PIPELINE_TOKENIZER_FILES.values()), config.data.tokenizer_path)
    else:
        resolved.data.update(tokenizer)
    check_vocabulary(resolved)
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
    """The checkpoint's architecture with the config's TRAINING_KEYS, and with the config's value of a family's
    phase key where it is not the presets' (a new phase's RoPE base); ELECTRA's generator sizes are the
    checkpoint's when it holds a generator, else the config's (that generator starts random)."""
    model = ml_collections.ConfigDict(pretrained.config.to_dict())
    model.update({key: config.model[key] for key in TRAINING_KEYS})
    family = families.of(config.model)
    preset = family.sizes[family.default_size]
    model.update({key: config.model[key] for key in family.phase_keys if config.model[key] != preset[key]})
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


def position_offset(model: ml_collections.ConfigDict) -> int:
    """Rows before the first position in the table: RoBERTa's pad_token_id + 1, else none."""
    return model.pad_token_id + 1 if families.of(model).position_offset else 0


def position_rows(model: ml_collections.ConfigDict, seq_length: int) -> int:
    """max_position_embeddings of a model that trains on `seq_length` tokens: the checkpoint's, or more."""
    return max(model.max_position_embeddings, seq_length + position_offset(model))


def copied_positions(table: np.ndarray, rows: int, offset: int) -> np.ndarray:
    """A position table (or its optimizer moments) grown to `rows` rows: new position p holds learned position
    p mod n (Longformer's initialisation); the offset rows before the first position stay as they are."""
    learned = table[offset:]
    repeats = -(-(rows - offset) // len(learned))
    return np.concatenate([table[:offset], np.tile(learned, (repeats,) + (1,) * (table.ndim - 1))[:rows - offset]])


def grown_positions(leaves: dict, target: dict, offset: int) -> tuple[dict, list[str]]:
    """Position tables of `leaves` with fewer rows than `target`'s grown by copying; and a note per grown table."""
    grown, notes = dict(leaves), []
    for path, value in leaves.items():
        wanted = target.get(path)
        if path.endswith("position_embeddings/embedding") and wanted is not None and value.shape[0] < wanted.shape[0]:
            grown[path] = copied_positions(np.asarray(value), wanted.shape[0], offset)
            notes.append(f"{path} grown from {value.shape[0]} to {wanted.shape[0]} rows by copying the learned "
                         "positions (Longformer)")
    return grown, notes


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
    target = traverse_util.flatten_dict(params, sep="/")
    source, grown = grown_positions(checkpoint_leaves(pretrained, config), target, position_offset(config.model))
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
              + (f" ({len(unused)} tensors)" if unused else "")
              + "".join(f"; {note}" for note in grown))
    return traverse_util.unflatten_dict(merged, sep="/"), report


# ------------------------------------------------------------------------------------------------------------------
# A new phase that keeps the optimizer state (config.init_from_optimizer).


def check_carried_optimizer(config: ml_collections.ConfigDict) -> None:
    """init_from is a bert_jax workdir whose optimizer state has the structure this config's optimizer builds."""
    workdir, _ = workdir_and_step(storage.as_path(config.init_from))
    if workdir is None:
        raise InitFromError(f"config.init_from_optimizer=True needs config.init_from to be a bert_jax workdir (it "
                            f"holds the optimizer state); {config.init_from} is not one: set init_from_optimizer=False")
    previous = json.loads((workdir / CONFIG_FILE).read_text()).get("optimizer", {})
    for key, same in (("name", lambda a, b: a == b), ("grad_clip_norm", lambda a, b: bool(a) == bool(b))):
        if key in previous and not same(previous[key], config.optimizer[key]):
            raise InitFromError(f"config.init_from_optimizer=True: config.optimizer.{key}={config.optimizer[key]!r} "
                                f"but the state in {workdir} is of {key}={previous[key]!r}; keep the previous "
                                "phase's optimizer, or set init_from_optimizer=False to start it afresh")


def carried_optimizer_state(opt_state, config: ml_collections.ConfigDict) -> tuple[Any, str]:
    """The optimizer state of the init_from workdir's step, placed as `opt_state` (the fresh one) is, its position
    moments grown like the table and its schedule restarted; and a line saying so."""
    workdir, step = workdir_and_step(storage.as_path(config.init_from))
    with checkpoints.checkpoint_manager(workdir, keep=1) as manager:
        step = manager.latest_step() if step is None else step
        stored = traverse_util.flatten_dict(manager.item_metadata(step)["params"].tree, sep="/")
        rows = {path: leaf.shape[0] for path, leaf in stored.items() if path.endswith("position_embeddings/embedding")}
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])

        def stored_shape(path, leaf):
            name = "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)
            old = next((n for p, n in rows.items() if name.endswith(p)), leaf.shape[0] if leaf.ndim else None)
            if leaf.ndim and old != leaf.shape[0]:
                return jax.ShapeDtypeStruct((old, *leaf.shape[1:]), leaf.dtype, sharding=cpu)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)

        target = {"opt_state": jax.tree_util.tree_map_with_path(stored_shape, opt_state),  # and, unused:
                  "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=cpu),
                  "rng": jax.ShapeDtypeStruct(jax.random.key_data(jax.random.key(0)).shape, jnp.uint32, sharding=cpu)}
        restored = manager.restore(step, args=ocp.args.Composite(train_state=ocp.args.StandardRestore(target)))
        restored = restored["train_state"]["opt_state"]
    offset = position_offset(config.model)
    grown = jax.tree.map(lambda old, new: old if old.shape == new.shape else copied_positions(np.asarray(old),
                                                                                               new.shape[0], offset),
                         restored, opt_state)
    placed = jax.device_put(grown, jax.tree.map(lambda x: x.sharding, opt_state))
    return (optimizer_lib.restart_schedule(placed),
            f"init_from_optimizer: optimizer state of step {step} of {workdir} carried over, its schedule restarted")


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
