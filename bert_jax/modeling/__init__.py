"""Pure flax.linen modules for the encoder families; parameters carry logical axis names only."""
from bert_jax.modeling.models import (
    HEAD_OF_OBJECTIVE,
    HEADS,
    Electra,
    ElectraDiscriminator,
    PreTrainingModel,
    SequenceClassifier,
    SpanExtractor,
    abstract_params,
    backbone,
    count_params,
    dummy_inputs,
    init_params,
    model_for_head,
    objective_head,
    pretraining_model,
)
from bert_jax.modeling.transformer import EncoderModel

__all__ = [
    "HEAD_OF_OBJECTIVE",
    "HEADS",
    "Electra",
    "ElectraDiscriminator",
    "PreTrainingModel",
    "SequenceClassifier",
    "SpanExtractor",
    "abstract_params",
    "backbone",
    "count_params",
    "dummy_inputs",
    "init_params",
    "model_for_head",
    "objective_head",
    "pretraining_model",
    "EncoderModel",
]
