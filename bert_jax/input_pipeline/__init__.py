"""Tokenizers, corpus preparation (once) and the tf.data pretraining pipeline (every epoch).

The trainer calls `make_pretraining_dataset(config, start_step, process_index, process_count)`. It is imported on
first use so that reading configs (which import `input_pipeline.config`) does not start TensorFlow.
"""
__all__ = ["PretrainingPipeline", "make_pretraining_dataset"]


def __getattr__(name):
    if name in __all__:
        from bert_jax.input_pipeline import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
