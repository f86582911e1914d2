"""bert_jax: BERT, RoBERTa, ALBERT, ELECTRA and ModernBERT in JAX/Flax."""
__all__ = ["Pretrained", "load_pretrained", "save_pretrained"]


def __getattr__(name):
    """Import the checkpoint API on first use: `import bert_jax.<submodule>` stays free of its JAX/Orbax imports."""
    if name in __all__:
        from bert_jax import pretrained

        return getattr(pretrained, name)
    raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")
