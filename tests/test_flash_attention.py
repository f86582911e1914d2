"""bert_jax's flash-attention kernel with dropout on the probabilities (bert_jax/modeling/flash_attention.py), in
Pallas' interpret mode on CPU: forward outputs and gradients equal a plain-JAX attention that drops the same hashed
mask, for padding, packed rows, local windows and several tiles; the mask keeps 1 - rate of the probabilities and
differs across heads, rows, seeds and steps; it does not depend on the mesh; the model's layers reach it through
attention_impl="splash". Shapes are tiny: the interpreter runs every tile one after another.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib, sharding
from bert_jax.config_lib import ConfigError
from bert_jax.modeling import flash_attention as fa
from bert_jax.modeling import transformer

RATE = 0.25


def hashed_mask(seed, rows: int, heads: int, seq: int, rate: float, row_offset: int = 0):
    """[B, heads, S, S] bool: keep_bits >= the threshold for every (row, head, query, key), computed whole."""
    index = lambda n, start=0: jnp.arange(start, start + n, dtype=jnp.uint32)
    keys = fa.head_keys(jnp.uint32(seed), index(rows, row_offset)[:, None], index(heads)[None])[:, :, None, None]
    return fa.keep_bits(keys, index(seq)[:, None], index(seq)[None]) >= fa.drop_threshold(rate)


def hashed_reference(q, k, v, segment_ids, seed, rate, half_window):
    """Plain-JAX attention over [B, heads, S, d] that drops hashed_mask's probabilities and scales the rest."""
    rows, heads, seq, _ = q.shape
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    allowed = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    if half_window is not None:
        position = jnp.arange(seq)
        allowed &= jnp.abs(position[:, None] - position[None]) <= half_window
    weights = jax.nn.softmax(jnp.where(allowed, logits, fa.MASKED), axis=-1)
    weights = jnp.where(hashed_mask(seed, rows, heads, seq, rate), weights * fa.keep_scale(rate), 0.0)
    return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(v.dtype), v)


def in_lanes(x):
    """[B, heads, S, d] -> the kernel's and the layers' [B, S, heads x d]."""
    rows, heads, seq, width = x.shape
    return jnp.swapaxes(x, 1, 2).reshape(rows, seq, heads * width)


def inputs(seq: int, packed: bool, heads: int = 2, width: int = 16):
    """q, k, v [2, heads, S, d]; row 1 with its last quarter padded (id -1, as segment_ids_for writes it); packed
    rows hold two examples (ids 1 and 2)."""
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, heads, seq, width), jnp.float32)
    ids = np.where(np.arange(seq) < seq // 3, 1, 2)[None].repeat(2, 0) if packed else np.zeros((2, seq), np.int32)
    ids[1, -seq // 4:] = -1
    return q, k, v, jnp.asarray(ids, jnp.int32)


CASES = {  # name: (sequence length, packed, half window, square tile, heads a grid step, heads, head width)
    "padding, one tile, both 16-wide heads in one step (under 128 lanes)": (128, False, None, 128, 2, 2, 16),
    "packed, one 256-key tile (two decisions a hash), two 64-wide heads a row": (256, True, None, 256, 2, 4, 64),
    "local window over three tiles, packed, four 64-wide heads a step": (384, True, 40, 128, 4, 4, 64),
    "global over 2 x 2 tiles of 256, a 128-wide head a step": (512, False, None, 256, 1, 2, 128),
}


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_the_hashed_reference_forward_and_backward(name):
    seq, packed, half_window, block, group, heads, width = CASES[name]
    tiling = fa.Tiling(seq, block, block, half_window, group)
    q, k, v, ids = inputs(seq, packed, heads, width)
    weights = jax.random.normal(jax.random.key(1), q.shape)

    def outputs_and_grads(attend):
        loss = lambda q, k, v: (lambda out: (jnp.sum(out * weights), out))(attend(q, k, v))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    heads_first = lambda out: jnp.swapaxes(out.reshape(*out.shape[:2], heads, width), 1, 2)
    (_, ours), our_grads = outputs_and_grads(lambda q, k, v: heads_first(fa.flash_attention(
        jnp.stack([in_lanes(q), in_lanes(k), in_lanes(v)]), ids, 7, RATE, heads, half_window, interpret=True,
        tiling=tiling)))
    (_, ref), ref_grads = outputs_and_grads(lambda q, k, v: hashed_reference(q, k, v, ids, 7, RATE, half_window))
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    for ours_grad, ref_grad in zip(our_grads, ref_grads):
        np.testing.assert_allclose(ours_grad, ref_grad, atol=2e-4, rtol=1e-4)


def test_a_grid_step_takes_heads_that_fill_whole_128_lane_columns():
    """Heads lie side by side in the lanes, so a step's block of heads x d is whole 128-lane columns, or all the
    lanes: BERT-large's 64-wide heads at 512 tokens go two a step, though one 512 x 512 tile would be the size
    limit; BERT-base's twelve at 128 tokens all at once; a tiny model's two 16-wide heads together."""
    assert fa.pick_tiling(512, 16, 64, None).heads == 2
    assert fa.pick_tiling(128, 12, 64, None).heads == 12
    assert fa.pick_tiling(256, 2, 16, None).heads == 2
    assert fa.pick_tiling(1024, 4, 128, 64).heads == 4  # 128-wide heads fill their own columns
    windows = [fa.HeadWindow.of(g, 4, 256) for g in range(4)]  # four 64-wide heads in 256 lanes
    assert [(w.start, w.size, w.offset) for w in windows] == [(0, 128, 0), (0, 128, 64), (128, 128, 0),
                                                              (128, 128, 64)]


def kernel_mask(seed, seq: int = 256, rows: int = 2, heads: int = 2, row_offset: int = 0):
    """The mask the kernel applies, read off its output: with all logits equal and V the identity, output row q is
    its kept keys x keep_scale / S."""
    q = jnp.zeros((rows, heads, seq, seq), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(seq, dtype=jnp.float32), q.shape)
    ids = jnp.zeros((rows, seq), jnp.int32)
    out = fa.flash_attention(jnp.stack([in_lanes(q), in_lanes(q), in_lanes(v)]), ids, seed, RATE, heads,
                             row_offset=row_offset, interpret=True)
    out = jnp.swapaxes(out.reshape(rows, seq, heads, seq), 1, 2)
    return np.asarray(out * seq / fa.keep_scale(RATE)) > 0.5


def test_the_kernel_drops_the_hashed_mask_and_keeps_one_minus_the_rate():
    mask = kernel_mask(seed=11, row_offset=5)
    np.testing.assert_array_equal(mask, hashed_mask(11, 2, 2, 256, RATE, row_offset=5))
    kept, entries = mask.mean(), mask.size  # 2^18 decisions
    assert abs(kept - (1 - RATE)) < 5 * np.sqrt(RATE * (1 - RATE) / entries)
    # The same over many more decisions, straight from the hash: 4 rows x 4 heads x 512^2.
    for rate in (0.1, 0.5):
        big = jax.jit(hashed_mask, static_argnums=(1, 2, 3, 4))(3, 4, 4, 512, rate)
        assert abs(float(big.mean()) - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / big.size)
    assert fa.drop_threshold(0.1) == 6554 and fa.keep_scale(0.1) == pytest.approx(1 / (1 - 6554 / 65536))


def agreement_bound(entries: int) -> float:
    """Two independent masks agree on p^2 + (1 - p)^2 of their entries; five standard deviations of that share."""
    same = RATE ** 2 + (1 - RATE) ** 2
    return 5 * np.sqrt(same * (1 - same) / entries)


def test_masks_are_independent_across_heads_rows_queries_and_seeds():
    """Each pair of (row, head) masks, of one seed or two, agrees on as many entries as independent masks would;
    so do neighbouring queries and keys within one mask, and a key with its pair partner (one shared hash)."""
    one, other = kernel_mask(seed=1), kernel_mask(seed=2)
    masks = [one[0, 0], one[0, 1], one[1, 0], one[1, 1], other[0, 0]]
    same = RATE ** 2 + (1 - RATE) ** 2
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            assert abs((masks[a] == masks[b]).mean() - same) < agreement_bound(masks[a].size)
    mask = one[0, 0]
    for shifted, original in ((mask[1:], mask[:-1]), (mask[:, 1:], mask[:, :-1]), (mask[:, 128:], mask[:, :128])):
        assert abs((shifted == original).mean() - same) < agreement_bound(shifted.size)


def test_a_models_masks_are_a_pure_function_of_the_steps_rng():
    """A tiny BERT training with attention dropout through the kernel: the same step's rng (a resumed step) gives
    the same outputs bit for bit, the next step's others."""
    config = config_lib.load_preset("bert", "tiny").model
    config.update(attention_impl="splash", hidden_dropout_prob=0.0, num_hidden_layers=2, num_hidden_groups=2)
    ids = jax.random.randint(jax.random.key(1), (2, 128), 5, 1000)
    model = transformer.EncoderModel(config)
    params = model.init(jax.random.key(0), ids)["params"]
    apply = jax.jit(lambda step: model.apply({"params": params}, ids, deterministic=False,
                                             rngs={"dropout": jax.random.fold_in(jax.random.key(2), step)}))
    step_3, again, step_4 = (apply(step)["last_hidden_state"] for step in (3, 3, 4))
    np.testing.assert_array_equal(step_3, again)
    assert not np.allclose(step_3, step_4, atol=1e-3)


def dropout_config(impl: str = "splash"):
    return config_lib.model_config("bert", attention_impl=impl, attention_probs_dropout_prob=RATE, hidden_size=32,
                                   num_attention_heads=2)


@pytest.mark.parametrize("half_window", [None, 4])
def test_dot_product_attention_runs_the_kernel_for_splash_with_dropout(half_window):
    """[B, S, heads x d] in, the logits scaled by 1/sqrt(d), the seed drawn from the dropout rng, segment ids from
    the attention mask, ModernBERT's local window: the layers' attention equals the hashed reference on the same
    inputs."""
    q, k, v, ids = inputs(128, packed=True)
    attention_mask = (ids >= 0).astype(jnp.int32)
    packing = jnp.where(ids >= 0, ids, 0)
    config = dropout_config()
    mask = transformer.layer_mask(config, attention_mask, packing, deterministic=False)
    rng = jax.random.key(5)
    ours = transformer.dot_product_attention(jnp.stack([in_lanes(x) for x in (q, k, v)]), mask, config, rng,
                                             half_window)
    ref = hashed_reference(q / np.sqrt(q.shape[-1]), k, v, mask, fa.seed_from(rng), RATE, half_window)
    real = (ids >= 0)[:, :, None]
    np.testing.assert_allclose(ours * real, in_lanes(ref) * real, atol=1e-5)


def test_the_mask_does_not_depend_on_the_mesh():
    """Under a (data 2, tensor 2) mesh each device holds 2 rows x 2 heads; the kernel hashes their global indices, so
    the output equals the unsharded one."""
    q, k, v, ids = (x.repeat(2, axis=0) for x in inputs(128, packed=False, heads=4))
    attend = lambda q, k, v: transformer.splash_attention(jnp.stack([q, k, v]), ids, q.shape[-1] // 4, None,
                                                          jax.random.key(9), RATE)
    whole = attend(*map(in_lanes, (q, k, v)))
    mesh = sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])
    placed = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor"))

    def sharded(q, k, v):
        with sharding.activation_sharding(mesh):
            return attend(q, k, v)

    split = jax.jit(sharded)(*(jax.device_put(in_lanes(x), placed) for x in (q, k, v)))
    np.testing.assert_allclose(split, whole, atol=1e-6)


def test_attention_dropout_runs_in_splash_and_auto_on_tpu(monkeypatch):
    assert transformer.attention_kernel(dropout_config("splash"), deterministic=False, seq_length=256) == "splash"
    assert transformer.attention_kernel(dropout_config("auto"), deterministic=False, seq_length=256) == "reference"
    monkeypatch.setattr(sharding, "target_platform", lambda: "tpu")
    assert transformer.attention_kernel(dropout_config("auto"), deterministic=False, seq_length=256) == "splash"
    assert transformer.attention_kernel(dropout_config("auto"), deterministic=False, seq_length=200) == "reference"
    with pytest.raises(ConfigError, match="attention_impl='xla': this fused kernel has no attention dropout"):
        transformer.attention_kernel(dropout_config("xla"), deterministic=False)
