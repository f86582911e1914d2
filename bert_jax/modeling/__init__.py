"""Pure flax.linen modules for the four encoder families; parameters carry logical axis names only."""
from bert_jax.modeling.models import (
    Electra,
    ElectraDiscriminator,
    PreTrainingModel,
    SequenceClassifier,
    SpanExtractor,
    abstract_params,
    count_params,
    dummy_inputs,
    init_params,
    pretraining_model,
)
from bert_jax.modeling.transformer import EncoderModel
