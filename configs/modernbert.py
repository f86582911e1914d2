"""ModernBERT (Warner et al., 2024): pre-norm encoder with rotary positions, GeGLU, alternating local/global
attention, no biases; MLM only (30% masking in the paper), no NSP; StableAdamW with a warmup-stable-decay schedule
(1-sqrt decay) on packed sequences. The presets are phase 1 of the paper's three (global RoPE theta 10k); the
commands of all three phases are in docs/recipes.md.

    python -m bert_jax.train --config=configs/modernbert.py:base --workdir=runs/modernbert-base
"""
from bert_jax import config_lib


def get_config(size="base"):
    """The modernbert preset of this size; the sizes, objective and data defaults are in
    bert_jax/families/modernbert.py."""
    return config_lib.load_preset("modernbert", size)
