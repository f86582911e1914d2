"""Attention on NVIDIA GPUs: when "auto" runs cuDNN's fused flash attention, and how padding reaches it.

cuDNN's kernel (jax.nn.dot_product_attention(implementation="cudnn")) never materialises the [B, heads, S, S] logits
or probabilities. On an H200 at [64, 512, 16, 64] in bfloat16 it took 1.42 ms forward + backward against XLA's
3.93 ms (benchmarks/RESULTS.md, "Device check"). It takes bfloat16 or float16, a head width that is a multiple of 8
(up to 128, or 256 from Hopper on), and no dropout on the probabilities. Padding reaches it as the number of real
keys of each row (key_value_seq_lengths), never as a [B, S, S] mask: a boolean mask becomes an additive bias whose
gradient cuDNN then computes. Every query, padding ones too, sees the real keys, as under the reference attention.

What the public API cannot give cuDNN runs XLA's attention, with one log line saying why:
- packed rows (segment ids): the API has no segment ids; XLA's attention with the [B, 1, S, S] mask.
- ModernBERT's local layers: cuDNN's window is left-only unless causal, and theirs is symmetric; XLA's attention
  with the window and the lengths (the global layers of an unpacked ModernBERT still run cuDNN).
benchmarks/device_check.py measures both fallbacks against the alternatives JAX has (cuDNN with the mask as a bias,
Pallas' Triton flash kernel with segment ids); docs/training.md has the table.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import logging

FUSED_DTYPES = ("bfloat16", "float16")
_logged: set[str] = set()


def log_once(message: str) -> None:
    """One log line per distinct reason and process (a step traces every layer, and retraces on new shapes), at
    WARNING: bert_jax's commands show no INFO lines unless asked (--verbosity)."""
    if message not in _logged:
        _logged.add(message)
        logging.warning("attention: %s", message)


def max_head_width() -> int:
    """cuDNN's widest head: 256 from Hopper (compute capability 9.0) on, 128 before, as JAX checks it when it traces
    the call: against the local GPU, so 128 when compiling for a GPU on a machine without one."""
    if jax.default_backend() != "gpu":
        return 128
    return 256 if float(jax.local_devices()[0].compute_capability) >= 9.0 else 128


def cudnn_unfit_reason(config) -> str | None:
    """Why cuDNN's kernel cannot run this model's attention, or None when it can (dropout is attention_kernel's)."""
    width = config.hidden_size // config.num_attention_heads
    if config.dtype not in FUSED_DTYPES:
        return f"config.model.dtype={config.dtype}: cuDNN's fused attention takes {' or '.join(FUSED_DTYPES)}"
    if width % 8 or width > max_head_width():
        return f"head width {width}: cuDNN's fused attention takes multiples of 8 up to {max_head_width()}"
    return None


def auto_kernel(config) -> str:
    """What attention_impl="auto" runs on a GPU without attention dropout: "cudnn", or "auto" (XLA's attention,
    jax.nn.dot_product_attention's default) with a log line saying why not cuDNN."""
    reason = cudnn_unfit_reason(config)
    if reason is None:
        return "cudnn"
    log_once(f"XLA's attention, not cuDNN: {reason}")
    return "auto"


def saves_kernel_outputs(primitive, *_, **__) -> bool:
    """A remat policy that keeps what cuDNN's attention forward returns (its output and softmax statistics, which
    its backward reads), found by JAX's primitive for that call: they come out of a custom call inside JAX's
    custom_vjp, where no checkpoint_name reaches them. Without them a rematerialised layer runs the forward kernel
    again in its backward pass (tests/test_gpu_compile.py counts the calls)."""
    return primitive.name == "dot_product_attention_fwd_wrapper"


def key_lengths(attention_mask):
    """int32 [B]: the real tokens of each row, which cuDNN takes as the first that many keys (padding at the end, as
    every bert_jax pipeline and tokenizer pads). At least 1: a row of padding only (an evaluation batch's filler)
    then attends to its first token, finite, where no key at all would give NaN; its outputs are weighted out."""
    return jnp.maximum(jnp.sum(attention_mask > 0, axis=-1, dtype=jnp.int32), 1)


def attend(query, key, value, lengths, half_window: int | None, implementation: str = "cudnn"):
    """Attention over [B, S, heads, d] where row b sees its first lengths[b] keys (and only those within half_window
    of the query, when given). cuDNN for global attention; a symmetric window runs XLA's attention, the same call
    otherwise. `implementation="xla"` runs the global case on any platform (the CPU tests check the lengths)."""
    if half_window is not None:
        log_once("XLA's attention for local windows: cuDNN's window is left-only unless causal")
        implementation = "xla"
    return jax.nn.dot_product_attention(query, key, value, key_value_seq_lengths=lengths,
                                        local_window_size=half_window, implementation=implementation)


def log_packed_fallback() -> None:
    log_once("XLA's attention for packed rows: jax.nn.dot_product_attention gives cuDNN no segment ids")
