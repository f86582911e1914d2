"""The model families: one file per family (`bert_jax/families/<name>.py`) holding a frozen `Family`, the only place
that knows what is specific to it. Every other module asks the registry (`get(name)`, `of(model_config)`) instead of
comparing family names, so a new encoder is one new file here, its config in configs/ and its tests.

A family file defines `FAMILY = Family(...)` and imports nothing from the trainer or the input pipeline; it may hold
modules of its own (see `Family.encoder`) when its architecture is not the shared post-LN encoder.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from typing import Any, Callable, Mapping

from bert_jax.errors import UserError


class UnknownFamilyError(UserError, ValueError):
    """A family name no file in bert_jax/families/ defines."""


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The tokenizer a family's presets read: kind (wordpiece | sentencepiece | bpe), the file of the tiny preset
    (bundled with the repository), and of the full-size presets ("" where none ships: set data.tokenizer_path)."""

    kind: str
    tiny_path: str
    full_path: str = ""


@dataclasses.dataclass(frozen=True)
class HfNames:
    """Where the family's tensors sit in HF transformers' files, and which classes hold them."""

    base_prefix: str  # the backbone's attribute in the HF head classes ("bert" in BertForPreTraining)
    architectures: Mapping[str, str]  # head -> HF class name
    layer: str = "encoder.layer.{index}"  # one transformer layer (ALBERT: a layer group)
    layer_modules: Mapping[str, str] = dataclasses.field(default_factory=lambda: {
        "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
        "attention_output": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense", "output": "output.dense", "output_norm": "output.LayerNorm"})
    embedding_projection: str = "embeddings_project"
    pooler: str | None = "pooler.dense"  # None: HF's model has no pooler (and bert_jax's defaults to none)
    mlm: tuple[str, str, str] | None = None  # (transform dense, transform LayerNorm, output bias)
    sentence_pair: str | None = None  # the NSP / SOP classifier
    discriminator: tuple[str, str] | None = None  # ELECTRA's (dense, prediction)
    config_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # written into config.json as is
    config_drops: tuple[str, ...] = ()  # bert_jax keys HF's config class of this family does not have
    # The special-token ids HF's config class holds, as the released vocabulary numbers them ("bos_token_id": 0).
    # An export writes its tokenizer's ids instead (state_dict.special_token_ids).
    special_token_ids: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Tf1Names:
    """The original Google release's checkpoint: variable-name rewrites (applied in order, before the shared ones)
    into HF names, and the config file beside model.ckpt-* ("" when releases ship none: sizes come from shapes)."""

    marker: str  # a regex that some variable name of the release matches, and none of another family's
    rules: tuple[tuple[str, str], ...]
    config_file: str = ""


@dataclasses.dataclass(frozen=True)
class HfConversion:
    """The HF conversion of a family whose tensors do not follow the shared encoder's tables (state_dict)."""

    tensor_pairs: Callable  # (model, head, hf_base) -> iterable of (HF name, bert_jax parameter path, kind)
    to_ours: Callable  # (array, kind, model) -> the array in bert_jax's layout
    to_hf: Callable  # (array, kind, model) -> the array in HF's layout
    config_to_hf: Callable  # (model, head) -> config.json dict
    sizes_from_hf: Callable  # config.json dict -> config_lib.model_config keyword arguments
    derived_suffixes: tuple[str, ...] = ()  # tensors HF ties to others (never information)


@dataclasses.dataclass(frozen=True)
class Family:
    """What is specific to one encoder family; the defaults are BERT's."""

    name: str
    title: str  # the paper's model, as tables print it: "BERT"
    published: str  # year-month of the paper (arXiv): the registry lists families in this order
    recipe: str  # how it pretrains, in a few words, for the comparison's table
    objective: str  # what its pretraining trains: mlm_nsp | mlm_sop | mlm | rtd
    sizes: Mapping[str, Mapping[str, Any]]  # presets, in the order the paper lists them: model config overrides
    default_size: str
    paper_params_millions: Mapping[str, float]  # size -> the backbone's parameter count the paper reports
    tokenizer: Tokenizer
    example_kind: str  # how pretraining examples are built (input_pipeline.examples)
    hf: HfNames
    masking: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # overrides of config_lib's masking defaults
    optimizer: str = "adamw"  # adamw | lamb | stable_adamw (bert_jax.optimizer)
    optimizer_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # overrides of config.optimizer
    learning_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)  # size -> the paper's peak rate
    tf1: Tf1Names | None = None
    # Quirks of the shared encoder.
    position_offset: bool = False  # fairseq numbering: positions start at pad_token_id + 1, padding keeps its own
    always_projects_embeddings: bool = False  # ALBERT maps E -> H even when equal; the others when they differ
    factorized_embeddings: bool = False  # the comparison gives it its budget's (narrower) embedding_size
    shared_layers: bool = False  # ALBERT: layers share weights within num_hidden_groups groups
    mlm_activation: str | None = None  # the MLM head's activation when it is not the encoder's hidden_act
    pair_separators: int = 1  # [SEP]s between the two texts of a pair (RoBERTa: <s> a </s></s> b </s>)
    pair_token_types: bool = True  # the second text of a pair gets token type 1 (RoBERTa: one type)
    has_generator: bool = False  # ELECTRA: a narrower MLM generator beside the discriminator
    scans_layers: bool = True  # its layers are alike, so scan_layers can stack them
    # Its layers hand attention Q, K and V as one stacked array, as the shared encoder's QKV projection writes them
    # (ModernBERT rotates Q and K apart from V, and hands the three): transformer.tpu_kernel reads it.
    stacked_qkv: bool = True
    # Model keys a new training phase may change without touching the parameters (ModernBERT's RoPE bases): with
    # init_from, a value other than the presets' replaces the checkpoint's (init_from.checkpoint_model).
    phase_keys: tuple[str, ...] = ()
    ffn_matrices: int = 2  # H x I matrices in a feed-forward block (FLOPs): 2, or 3 with a gated unit (GeGLU)
    # (model config, layer index) -> how far a query of that layer sees on either side (ModernBERT's local layers),
    # None for global attention. FLOPs and the splash attention kernel read it.
    attention_half_window: Callable | None = None
    # A family whose architecture is not the shared encoder gives its own modules and HF conversion (modernbert).
    encoder: Callable | None = None  # (config, shared_embeddings=None, name=...) -> module; like EncoderModel
    mlm_head: Callable | None = None  # (config, name=...) -> module; like modeling.models.MlmHead
    hf_conversion: HfConversion | None = None

    @property
    def heads(self) -> tuple[str, ...]:
        """The heads (what sits on the backbone; see modeling.HEADS) its checkpoints can hold. ELECTRA's masked-LM
        model is its generator."""
        if self.has_generator:
            return ("backbone", "discriminator", "generator", "both")
        return ("backbone", "masked_lm") + (("pretraining",) if self.hf.sentence_pair else ())


@functools.cache
def names() -> tuple[str, ...]:
    """Every family, one per module in this package, oldest paper first."""
    found = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return tuple(sorted(found, key=lambda name: (load(name).published, name)))


def get(name: str) -> Family:
    """The family called `name`; an error listing the others if there is none."""
    if name not in names():
        raise UnknownFamilyError(f"unknown model family {name!r}; bert_jax has {names()} "
                                 "(one file each in bert_jax/families/)")
    return load(name)


def load(name: str) -> Family:
    return importlib.import_module(f"{__name__}.{name}").FAMILY


def of(model_config) -> Family:
    """The family of a model config (config.model)."""
    return get(model_config.family)
