"""Original Google TF1 checkpoints (google-research bert, albert, electra) as HF state dicts and HF config dicts.

An ordered table of rewrites per family turns each TF1 variable name into the HF tensor name that `state_dict` already
maps (e.g. bert/encoder/layer_0/attention/self/query/kernel -> bert.encoder.layer.0.attention.self.query.weight);
TF kernels are [in, out] and are transposed to PyTorch's [out, in]. Everything after that is the HF path.
The checkpoint may be local or in a bucket: TensorFlow's reader only ever opens a local copy (see `storage`).
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from bert_jax import families, storage
from bert_jax.state_dict import ConversionError, LoadError

# Optimizer slots and step counters that training checkpoints carry next to the weights.
TRAINING_STATE = re.compile(r"(/adam_[mv]|^global_step)$")
COMMON_RULES = (
    (r"/gamma$", "/weight"),
    (r"/beta$", "/bias"),
    (r"/(kernel|output_weights)$", "/weight"),
    (r"/output_bias$", "/bias"),
    (r"_embeddings$", "_embeddings/weight"),
    (r"/", "."),
)


def hf_name(tf_name: str, family: str) -> str:
    for pattern, replacement in families.get(family).tf1.rules + COMMON_RULES:
        tf_name = re.sub(pattern, replacement, tf_name)
    return tf_name


def detect_family(tf_names) -> str:
    """The family whose release names these variables (families.Tf1Names.marker)."""
    released = [f for f in families.names() if families.get(f).tf1 is not None]
    for family in released:
        if any(re.search(families.get(family).tf1.marker, name) for name in tf_names):
            return family
    markers = ", ".join(f"{f}: {families.get(f).tf1.marker}" for f in released)
    raise ConversionError(f"cannot tell which model these TF variables belong to (e.g. {sorted(tf_names)[:3]}); "
                          f"expected the names of an original release ({markers})")


def to_hf_state(tf_state: dict[str, np.ndarray], family: str) -> dict[str, np.ndarray]:
    """HF-named tensors; kernels transposed. Two TF names mapping to one HF name is an error naming both."""
    state, source = {}, {}
    for tf_name, array in tf_state.items():
        name = hf_name(tf_name, family)
        if name in state:
            raise ConversionError(f"TF variables {source[name]} and {tf_name} both map to {name}")
        state[name], source[name] = (array.T if tf_name.endswith("/kernel") else array), tf_name
    return state


def split_electra(state: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """{"discriminator": ElectraForPreTraining tensors, "generator": ElectraForMaskedLM tensors (if present)}.

    The generator reads the discriminator's embeddings (ELECTRA ties them), so they go into both.
    """
    generator = {n: v for n, v in state.items() if n.startswith(("generator_predictions.", "generator_lm_head."))}
    generator.update({"electra." + n.removeprefix("generator."): v for n, v in state.items()
                      if n.startswith("generator.")})
    discriminator = {n: v for n, v in state.items() if not n.startswith("generator")}
    if not generator:
        return {"discriminator": discriminator}
    for name, value in discriminator.items():  # untied generator embeddings (rare) stay its own
        if name.startswith("electra.embeddings."):
            generator.setdefault(name, value)
    return {"discriminator": discriminator, "generator": generator}


def _encoder_sizes(shapes: dict, scope: str) -> dict:
    """ELECTRA releases ship no config file: sizes from the weights, heads by ELECTRA's rule (64-wide heads)."""
    layers = {int(m.group(1)) for n in shapes if (m := re.match(rf"{scope}/encoder/layer_(\d+)/", n))}
    hidden, intermediate = shapes[f"{scope}/encoder/layer_0/intermediate/dense/kernel"]
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=len(layers),
                num_attention_heads=max(1, hidden // 64))


def electra_hf_configs(shapes: dict) -> dict[str, dict]:
    vocab_size, embedding_size = shapes["electra/embeddings/word_embeddings"]
    common = dict(model_type="electra", vocab_size=vocab_size, embedding_size=embedding_size,
                  max_position_embeddings=shapes["electra/embeddings/position_embeddings"][0],
                  type_vocab_size=shapes["electra/embeddings/token_type_embeddings"][0], hidden_act="gelu_new")
    configs = {"discriminator": {**common, **_encoder_sizes(shapes, "electra")}}
    if any(n.startswith("generator/") for n in shapes):
        configs["generator"] = {**common, **_encoder_sizes(shapes, "generator")}
    return configs


def index_file(prefix: storage.Path) -> storage.Path:
    """A checkpoint prefix names no file itself; its .index file says it exists."""
    return storage.as_path(f"{prefix}.index")


def latest_checkpoint(directory: storage.Path) -> storage.Path | None:
    """The checkpoint that the directory's `checkpoint` file names, if its files are in the directory. Read here,
    not by tf.train.latest_checkpoint, which would open a bucket itself; the name is looked up in this directory,
    as the file often holds the absolute path where training ran."""
    state = directory / "checkpoint"
    if not state.exists() or not (named := re.search(r'^model_checkpoint_path:\s*"(.*)"', state.read_text(),
                                                      re.MULTILINE)):
        return None
    prefix = directory / named.group(1).rsplit("/", 1)[-1]
    return prefix if index_file(prefix).exists() else None


def checkpoint_prefix(path: storage.Path) -> storage.Path:
    """The checkpoint a directory's `checkpoint` file names, its only *.index file, or `path` itself as a prefix."""
    if index_file(path).exists():
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    indexes = sorted(path.glob("*.index"))
    if len(indexes) != 1:
        raise ConversionError(f"{path}: expected one TF checkpoint (model.ckpt-*.index) or a `checkpoint` file, found "
                              f"{[i.name for i in indexes]}; pass the checkpoint prefix, e.g. {path}/model.ckpt-1000")
    return indexes[0].with_suffix("")


def read(path: storage.PathLike) -> tuple[dict[str, dict], dict[str, dict[str, np.ndarray]]]:
    """(HF config dicts, HF state dicts), keyed "model", or "discriminator" and "generator" for ELECTRA."""
    import tensorflow as tf

    prefix = checkpoint_prefix(storage.as_path(path))
    try:
        # TensorFlow reads the prefix's .index and .data-* files from a local copy (in place when local).
        with storage.local_copy([index_file(prefix), *storage.glob(f"{prefix}.data-*")]) as folder:
            reader = tf.train.load_checkpoint(os.path.join(folder, prefix.name))
            shapes = {n: s for n, s in reader.get_variable_to_shape_map().items() if not TRAINING_STATE.search(n)}
            tf_state = {name: reader.get_tensor(name) for name in shapes}
    except (tf.errors.OpError, ValueError, IndexError, OSError) as e:  # a truncated .data-* file: IndexError
        raise LoadError(f"{prefix}: cannot read the TF checkpoint ({e}); its .index or .data-* file is truncated or "
                        f"missing — copy {prefix.name}.* into {prefix.parent} again") from e
    family = detect_family(shapes)
    state = to_hf_state(tf_state, family)
    if not families.get(family).tf1.config_file:  # ELECTRA: no config file, sizes from the shapes
        configs, states = electra_hf_configs(shapes), split_electra(state)
        return (configs, states) if "generator" in states else ({"model": configs["discriminator"]},
                                                                 {"model": states["discriminator"]})
    config_file = prefix.parent / families.get(family).tf1.config_file
    if not config_file.exists():
        raise ConversionError(f"{config_file} not found: an original {family} checkpoint directory holds its config "
                              "next to model.ckpt-*")
    hf_config = {**json.loads(config_file.read_text()), "model_type": family}
    if hf_config.get("hidden_act") == "gelu":
        hf_config["hidden_act"] = "gelu_new"  # the original TF code's gelu is the tanh approximation
    return {"model": hf_config}, {"model": state}
