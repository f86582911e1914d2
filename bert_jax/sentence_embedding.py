"""Sentence vectors from an encoder, and the sentence-transformers folder that records how they are made.

An embedding model is an encoder plus a rule: which hidden states become the vector (the [CLS] token's, or the mean
over real tokens), whether it is scaled to unit length, and how many tokens of a text are read. `Pooling` is that
rule: `Pretrained.embed` applies it, `bert_jax.embed_train` trains through it, and a sentence-transformers folder
stores it beside the HF weights, so that `SentenceTransformer(folder).encode` gives the same vectors:
  modules.json               the pipeline: Transformer (the HF files at the top), Pooling, Normalize when normalized
  sentence_bert_config.json  max_seq_length (tokens read per text) and do_lower_case
  1_Pooling/config.json      the pooling mode and the vector width
  2_Normalize/               present when vectors are scaled to unit length
"""
from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp

from bert_jax import storage
from bert_jax.errors import UserError

POOLINGS = ("cls", "mean")
# sentence-transformers' module classes, as its modules.json names them.
TRANSFORMER, POOLING, NORMALIZE = (f"sentence_transformers.models.{name}" for name in
                                   ("Transformer", "Pooling", "Normalize"))
# 1_Pooling/config.json: one boolean per mode; bert_jax computes the first two.
POOLING_MODE_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
OTHER_POOLING_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


class SentenceFolderError(UserError, ValueError):
    """A sentence-transformers folder whose modules bert_jax cannot reproduce; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Pooling:
    """How a text becomes one vector: `mode` "cls" or "mean" (over real tokens), `normalize` to unit length, at most
    `max_seq_length` tokens read, special tokens included (0: as many as the model's positions allow)."""

    mode: str = "cls"
    normalize: bool = False
    max_seq_length: int = 0

    def __post_init__(self):
        if self.mode not in POOLINGS:
            raise ValueError(f"pooling={self.mode!r}; choose one of {POOLINGS}")


# What sentence-transformers builds for an HF folder without modules.json: mean pooling, not normalized.
DEFAULT_EXPORT_POOLING = Pooling(mode="mean")


def overridden(pooling: Pooling | None, mode: str | None = None, normalize: bool | None = None,
               default: Pooling = Pooling()) -> Pooling:
    """`pooling` (`default` when None) with the settings a caller gives; None keeps the stored one."""
    pooling = pooling or default
    return dataclasses.replace(pooling, mode=pooling.mode if mode is None else mode,
                               normalize=pooling.normalize if normalize is None else normalize)


def pool(hidden, attention_mask, pooling: Pooling):
    """[B, S, H] hidden states and their [B, S] mask -> [B, H] vectors; sentence-transformers' arithmetic (mean over
    real tokens with the count floored at 1e-9, norms floored at 1e-12), traceable under jit."""
    if pooling.mode == "cls":
        vectors = hidden[:, 0]
    else:
        mask = attention_mask[..., None].astype(hidden.dtype)
        vectors = (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
    if pooling.normalize:
        vectors = vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors


# ---------------------------------------------------------------------------------------------- the folder's files


def write_folder_files(directory: storage.Path, pooling: Pooling, hidden_size: int, max_seq_length: int) -> None:
    """Write the sentence-transformers files beside the HF ones already in `directory`."""
    modules = [(TRANSFORMER, ""), (POOLING, "1_Pooling")] + ([(NORMALIZE, "2_Normalize")] if pooling.normalize else [])
    listing = [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (kind, path) in enumerate(modules)]
    (directory / "modules.json").write_text(json.dumps(listing, indent=2) + "\n")
    # Lower-casing, where the model wants it, is the tokenizer's own normalizer; sentence-transformers adds none.
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2) + "\n")
    modes = {key: pooling.mode == mode for mode, key in POOLING_MODE_KEYS.items()}
    pooling_config = {"word_embedding_dimension": hidden_size, **modes, **dict.fromkeys(OTHER_POOLING_MODES, False),
                      "include_prompt": True}
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")
    if pooling.normalize:
        (directory / "2_Normalize").mkdir()
    similarity = {"similarity_fn_name": "cosine", "prompts": {}, "default_prompt_name": None}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(similarity, indent=2) + "\n")


def read_folder_pooling(directory: storage.Path) -> Pooling | None:
    """The Pooling a sentence-transformers folder describes (None when `directory` has no modules.json); modules that
    bert_jax does not compute (Dense, max pooling, ...) are an error naming the file, never silently left out."""
    listing_file = directory / "modules.json"
    if not listing_file.exists():
        return None
    listing = _read_json(listing_file)
    kinds = {module.get("type", "").rsplit(".", 1)[-1]: module for module in listing}
    unknown = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if unknown or "Pooling" not in kinds:
        raise SentenceFolderError(f"{listing_file}: modules {unknown or ['(no Pooling)']} are not computed by "
                                  "bert_jax, so its vectors would differ; load the HF weights alone "
                                  "(load_pretrained(folder).encode) and add those layers yourself")
    config_file = directory / kinds["Pooling"]["path"] / "config.json"
    modes = pooling_modes(_read_json(config_file))
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise SentenceFolderError(f"{config_file}: pooling {modes} is not one of {POOLINGS}; bert_jax computes [CLS] "
                                  "or mean pooling")
    return Pooling(modes[0], "Normalize" in kinds, folder_max_seq_length(directory))


def pooling_modes(pooling_config: dict) -> list[str]:
    """The modes a Pooling config switches on: sentence-transformers 6 writes "pooling_mode", earlier versions one
    boolean per mode (pooling_mode_mean_tokens, ...)."""
    if "pooling_mode" in pooling_config:
        mode = pooling_config["pooling_mode"]
        return [mode] if isinstance(mode, str) else list(mode)
    keys = {**{key: mode for mode, key in POOLING_MODE_KEYS.items()}, **{key: key for key in OTHER_POOLING_MODES}}
    return [mode for key, mode in keys.items() if pooling_config.get(key)]


def folder_max_seq_length(directory: storage.Path) -> int:
    """Tokens sentence-transformers reads per text: sentence_bert_config.json's max_seq_length, else (version 6) the
    tokenizer's model_max_length; 0 when neither sets one."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        file = directory / name
        value = _read_json(file).get(key) if file.exists() else None
        if isinstance(value, int) and 0 < value < 1_000_000:  # transformers writes 1e30 for "no limit"
            return value
    return 0


def run_keys(pooling: Pooling | None) -> dict:
    """The config.json keys that record `pooling` ({} for None): what pooling_of_run reads back."""
    if pooling is None:
        return {}
    return {"pooling": pooling.mode, "normalize": pooling.normalize, "max_seq_length": pooling.max_seq_length}


def pooling_of_run(saved_config: dict) -> Pooling | None:
    """The Pooling an embedding run (bert_jax.embed_train) trained with, from its config.json; None for other runs."""
    if "pooling" not in saved_config:
        return None
    return Pooling(saved_config["pooling"], bool(saved_config["normalize"]), int(saved_config["max_seq_length"]))


def _read_json(file: storage.Path):
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise SentenceFolderError(f"{file}: cannot read it as JSON ({e}); export the folder again") from e
