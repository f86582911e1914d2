"""Flash attention with dropout on the attention probabilities: bert_jax's own Pallas kernel for TPU.

BERT, RoBERTa and ELECTRA train with dropout 0.1 on the attention probabilities; splash attention has none. Here
the kernel drops them itself. Without dropout it runs global attention too, where the compiler schedules it faster
than splash (transformer.tpu_kernel).

Whether query q of head h in batch row b keeps its probability for key k is a hash of (seed, b, h, q, k)
(`keep_bits`), so the backward pass recomputes each tile's mask from the same integers and no [B, heads, S, S]
array is ever stored. The seed is drawn from the layer's dropout rng, as every other dropout's bits are: the mask is
a pure function of the step's rng, and a resumed run drops the same probabilities. b and h are the global batch row
and head (not the shard's), so the mask does not depend on the mesh either.

The hash is murmur3's 32-bit finaliser (`mix32`: xor, logical shift and wrapping uint32 multiply), which Mosaic
lowers to the TPU's vector unit and Pallas' interpreter runs bit for bit the same on a CPU. Keys are mixed in two
stages so that a tile needs one mix per two entries: a row key mix32(head_key ^ 2q) per query, a column key
mix32(head_key ^ 2p + 1) per pair p of keys 128 apart (`pair_of`), and mix32(row ^ column) per query and pair,
whose high 16 bits decide the pair's first key and low 16 bits its second. Kept when those bits are at least
round(rate x 2^16); kept probabilities are scaled by 1 / (the kept fraction that threshold gives).

The masks the kernel applies are those of splash attention in transformer.py: [B, S] segment ids (a query sees the
keys of its own id; transformer.segment_ids_for) and optionally a symmetric local window. Only the kv tiles a
query tile's window reaches are in the grid (`Tiling`), so a local layer skips the rest.

Layout: q, k, v stacked [3, B, S, heads x d], as the QKV projection writes them (three arrays sliced out of it
would be a copy of all three), q already scaled by 1/sqrt(d); the output [B, S, heads x d], as the output
projection reads it. A token's heads lie side by side in the lanes, so a 64-wide head is half a 128-lane row, not a
padded row of its own (HeadWindow). The forward grid is (row, group of heads, q tile, kv tile); the backward grid
(row, group of heads, kv tile, q tile) computes dk and dv of a kv tile over its q tiles and adds each tile's dq
into a float32 [S, heads x d] accumulator that stays in VMEM for the row and group, so one kernel computes all
three gradients (5 matmuls a tile) and recomputes each tile's mask once.
"""
from __future__ import annotations

import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES, SUBLANES = 128, 8
KEEP_BITS = 16  # the hash bits compared with the threshold: rates resolve to 1 / 65536
PAIR = 128  # keys this far apart share a 32-bit hash, 16 bits each: half the hashing, in whole vregs
MASKED = -0.7 * float(np.finfo(np.float32).max)  # a masked logit: finite, so a tile masked whole gives no NaN
NT = (((1,), (1,)), ((), ()))  # contract both operands' last axes: a @ b.T
TN = (((0,), (0,)), ((), ()))  # contract both operands' first axes: a.T @ b


# ------------------------------------------------------------------------------------------------------------------
# The dropout mask: pure functions of integers, shared by the kernels and any reference.
# ------------------------------------------------------------------------------------------------------------------


def mix32(x):
    """murmur3's 32-bit finaliser: a bijection of uint32 in which every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def head_keys(seed, rows, heads):
    """uint32 key of each (batch row, head): mix32(mix32(seed ^ row) + head), broadcast over `rows` and `heads`
    (global indices, uint32)."""
    return mix32(mix32(seed ^ rows) + heads)


def row_keys(head_key, queries):
    return mix32(head_key ^ (queries * jnp.uint32(2)))


def column_keys(head_key, keys):
    return mix32(head_key ^ (keys * jnp.uint32(2) + jnp.uint32(1)))


def pair_of(keys):
    """Keys k and k + 128 (k mod 256 < 128) share one hash: the index of the pair, in the first one's position."""
    return ((keys >> 8) << 7) | (keys & (PAIR - 1))


def keep_bits(head_key, queries, keys):
    """The KEEP_BITS bits that decide the probability of (query, key) under one head's key (uint32 arrays that
    broadcast): the high half of mix32(row key ^ column key of the pair) for the pair's first key, the low half for
    its second."""
    mixed = mix32(row_keys(head_key, queries) ^ column_keys(head_key, pair_of(keys)))
    return jnp.where(keys & PAIR, mixed & 0xFFFF, mixed >> 16).astype(jnp.int32)


def drop_threshold(rate: float) -> int:
    """A probability is kept when keep_bits >= this: round(rate x 2^KEEP_BITS)."""
    return int(round(rate * 2 ** KEEP_BITS))


def keep_scale(rate: float) -> float:
    """1 / the fraction drop_threshold keeps: kept probabilities are divided by it, so their expectation holds."""
    return 2 ** KEEP_BITS / (2 ** KEEP_BITS - drop_threshold(rate))


def seed_from(dropout_rng) -> jax.Array:
    """The kernel's uint32 seed: 32 bits drawn from a layer's dropout rng (a pure function of the step's rng)."""
    return jax.random.bits(dropout_rng, (), jnp.uint32)


# ------------------------------------------------------------------------------------------------------------------
# Which tiles run.
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Tiles of one (row, head): block_q queries by block_k keys, for `heads` heads a grid step (a step has a fixed
    cost: short sequences want several heads a step). Under a window of half_window only the tiles it reaches run:
    tile `i` of one side meets tiles first(i) .. last(i) of the other, at most `band` of them."""

    seq: int
    block_q: int
    block_k: int
    half_window: int | None
    heads: int = 1

    def reach(self, tile, size: int, other: int):
        """(first, last) tile of size `other` that the window of tile `tile` (of size `size`) reaches."""
        count = self.seq // other
        if self.half_window is None:
            return 0, count - 1
        traced = isinstance(tile, jax.Array)  # a grid index in the kernel, an int in band() and pairs()
        maximum, minimum = (jnp.maximum, jnp.minimum) if traced else (max, min)
        divide = lax.div if traced else operator.floordiv  # of non-negative numbers (Mosaic has no floor division)
        first = divide(maximum(tile * size - self.half_window, 0), other)
        return first, minimum(divide((tile + 1) * size - 1 + self.half_window, other), count - 1)

    def band(self, size: int, other: int) -> int:
        """The most tiles of size `other` that one tile of size `size` meets."""
        return max(last - first + 1 for first, last in (self.reach(t, size, other) for t in range(self.seq // size)))

    def pairs(self) -> int:
        """(q tile, kv tile) pairs computed for one row and head."""
        return sum(last - first + 1 for first, last in
                   (self.reach(t, self.block_q, self.block_k) for t in range(self.seq // self.block_q)))

    def partner(self, tile, step, size: int, other: int):
        """(the `step`-th tile of size `other` that `tile` meets, whether it exists): past the last, the last again,
        so that the kernel's input stays in VMEM instead of being copied for nothing."""
        first, last = self.reach(tile, size, other)
        return jnp.minimum(first + step, last), first + step <= last


def pick_tiling(seq: int, heads: int, width: int, half_window: int | None) -> Tiling:
    """Square tiles: 512 (or the largest of 256 and 128 that divides S) for global attention, 128 under a window,
    where smaller tiles compute fewer pairs outside it (the sizes splash attention uses here too). Then as many
    heads a step as keep a step's tiles within 512 x 512 entries and the backward's float32 dq accumulator
    ([S, heads a step x width]) within 4 MiB, among the divisors of `heads` whose heads fill whole 128-lane
    columns (or all the lanes there are); the fewest of those where none is that small.

    Chosen by the compiler's schedule of the kernels for v5p (bundles x grid steps, BERT-large's 16 heads at 512
    tokens, BERT-base's 12 at 128): at 512 tokens one 512 x 512 tile a step beats 512 x 256 by 1.4x; at 128 tokens
    12 heads a step beat one by 2.0x."""
    fitting = [b for b in (512, 256, 128) if seq % b == 0]
    block = fitting[0] if half_window is None else fitting[-1]
    lane_groups = [g for g in range(1, heads + 1) if heads % g == 0 and (g * width % LANES == 0 or g == heads)]
    small = [g for g in lane_groups if g * block * block <= 512 * 512
             and seq * -(-g * width // LANES) * LANES * 4 <= 4 * 2 ** 20]
    return Tiling(seq, block, block, half_window, max(small) if small else min(lane_groups))


@dataclasses.dataclass(frozen=True)
class HeadWindow:
    """Where one head's d lanes sit in a grid step's block of heads x d lanes ([tokens, heads x d], as the
    projections lay them out: no lane of a 64-wide head is padding). A head is read through the whole 128-lane
    columns it lies in, `size` lanes from `start`, its own at `offset` (the block itself where it is narrower): an MXU
    contraction is 128 deep either way, so masking the neighbour's lanes to zero (`own`) costs a select, where
    shifting the head out of its row would cost lane rotations."""

    start: int
    size: int
    offset: int
    width: int

    @staticmethod
    def of(head: int, heads: int, lanes: int) -> "HeadWindow":
        width = lanes // heads
        size = width if width % LANES == 0 else LANES if lanes % LANES == 0 and LANES % width == 0 else lanes
        start = head * width // size * size
        return HeadWindow(start, size, head * width - start, width)

    def read(self, ref, rows=slice(None)):
        return ref[rows, self.start:self.start + self.size]

    def _mine(self, shape):
        lane = lax.broadcasted_iota(jnp.int32, shape, 1)
        return jnp.logical_and(lane >= self.offset, lane < self.offset + self.width)

    def own(self, ref):
        """The window with the other heads' lanes zero: contractions over it see this head only, and products
        with it are zero outside this head's lanes."""
        x = self.read(ref)
        return x if self.width == self.size else jnp.where(self._mine(x.shape), x, jnp.zeros_like(x))

    def merge(self, ref, value):
        """Write this head's lanes of `value` and leave the others' lanes as they are."""
        window = (slice(None), slice(self.start, self.start + self.size))
        ref[window] = value if self.width == self.size else jnp.where(self._mine(value.shape), value, ref[window])

    def add(self, ref, value, rows=slice(None), first_writes: bool = False):
        """Add a `value` that is zero outside this head's lanes (made from `own` operands). `first_writes`: the
        window's first head writes instead, so that an output its heads fill together needs no zeroing first."""
        window = (rows, slice(self.start, self.start + self.size))
        ref[window] = value if first_writes and self.offset == 0 else ref[window] + value


# ------------------------------------------------------------------------------------------------------------------
# The kernels.
# ------------------------------------------------------------------------------------------------------------------


def _down(start, rows: int, columns: int, axis: int):
    """uint32 start + index along `axis` of a [rows, columns] tile: positions replicated across the other axis."""
    return (start + lax.broadcasted_iota(jnp.int32, (rows, columns), axis)).astype(jnp.uint32)


def _spread(x, shape):
    """A lane- or sublane-replicated [rows, LANES] or [SUBLANES, columns] tile repeated to `shape` (vreg copies)."""
    return jnp.tile(x, (shape[0] // x.shape[0], shape[1] // x.shape[1]))


def _keep(head_key, q_start, k_start, shape, queries_first: bool, threshold: int):
    """The tile's keep mask (keep_bits >= threshold), queries along axis 0 (forward) or axis 1 (the backward's
    transposed tiles). Row and column keys are mixed once per query and key pair (on a [n, LANES] or [SUBLANES, n]
    tile), then once per two entries: a tile of 256 keys or more hashes its key pairs once and splits each hash
    into whole 128-key halves; a 128-key tile is one side of its pairs and keeps that half."""
    key_axis = 1 if queries_first else 0
    count = shape[key_axis]
    paired = count % (2 * PAIR) == 0
    hashed = list(shape)
    hashed[key_axis] = count // 2 if paired else count
    pair_start = k_start >> 1 if paired else (k_start >> 8) << 7
    if queries_first:
        rows = row_keys(head_key, _down(q_start, shape[0], LANES, 0))
        columns = column_keys(head_key, _down(pair_start, SUBLANES, hashed[1], 1))
    else:
        rows = row_keys(head_key, _down(q_start, SUBLANES, shape[1], 1))
        columns = column_keys(head_key, _down(pair_start, hashed[0], LANES, 0))
    mixed = mix32(_spread(rows, hashed) ^ _spread(columns, hashed))
    if paired:
        pieces = [lax.slice_in_dim(mixed, c * PAIR, (c + 1) * PAIR, axis=key_axis) for c in range(count // (2 * PAIR))]
        bits = jnp.concatenate([half for piece in pieces for half in (piece >> 16, piece & 0xFFFF)], axis=key_axis)
    else:
        bits = jnp.where(k_start & PAIR, mixed & 0xFFFF, mixed >> 16)
    return bits.astype(jnp.int32) >= threshold


def _head_key(keys_ref, b, h, group: int, g: int):
    """The key of head g of the step's group of `group` heads (h-th group of row b)."""
    return keys_ref[(b * pl.num_programs(1) + h) * group + g].astype(jnp.uint32)


def _allowed(tiling: Tiling, q_ids, k_ids, q_start, k_start, queries_first: bool):
    """Which pairs of a tile attend: same segment id, and within the window if there is one."""
    shape = (max(q_ids.shape[0], k_ids.shape[0]), max(q_ids.shape[1], k_ids.shape[1]))
    allowed = _spread(q_ids, shape) == _spread(k_ids, shape)
    if tiling.half_window is not None:
        q_axis, k_axis = (0, 1) if queries_first else (1, 0)
        distance = (k_start - q_start + lax.broadcasted_iota(jnp.int32, shape, k_axis)
                    - lax.broadcasted_iota(jnp.int32, shape, q_axis))
        allowed = jnp.logical_and(allowed, jnp.abs(distance) <= tiling.half_window)
    return allowed


def _forward_kernel(keys_ref, q_ref, k_ref, v_ref, q_ids_ref, k_ids_ref, o_ref, lse_ref, *scratch,
                    tiling: Tiling, threshold: int, scale: float):
    """One (row, group of heads, q tile, j-th kv tile it meets) step: online softmax over the kv tiles in the
    scratch (running max, sum and output), or, where a q tile meets one kv tile (S <= 512), straight to the outputs."""
    b, h, i, j = (pl.program_id(axis) for axis in range(4))
    bq, bk = tiling.block_q, tiling.block_k
    kv_tile, exists = tiling.partner(i, j, bq, bk)
    single = not scratch
    windows = [HeadWindow.of(g, tiling.heads, q_ref.shape[-1]) for g in range(tiling.heads)]

    def finish(g, m, total, acc):
        windows[g].merge(o_ref, (acc * (scale / total[:, :1])).astype(o_ref.dtype))
        lse_ref[g] = jnp.broadcast_to(m + jnp.log(total), (bq, LANES)).T[:1]

    if not single:
        m_ref, l_ref, acc_ref = scratch

        @pl.when(j == 0)
        def _init():
            m_ref[...] = jnp.full_like(m_ref, MASKED)
            l_ref[...] = jnp.zeros_like(l_ref)
            acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(exists)
    def _tile():
        allowed = _allowed(tiling, q_ids_ref[...], k_ids_ref[...], i * bq, kv_tile * bk, True)
        for g, window in enumerate(windows):
            q, k, v = window.own(q_ref), window.read(k_ref), window.read(v_ref)
            s = lax.dot_general(q, k, NT, preferred_element_type=jnp.float32)  # [bq, bk]
            s = jnp.where(allowed, s, MASKED)
            m_tile = s.max(axis=-1, keepdims=True)
            m_next = m_tile if single else jnp.maximum(m_ref[g], m_tile)  # [bq, 1] or [bq, LANES]
            p = jnp.exp(s - (m_next if single else jnp.tile(m_next, (1, bk // LANES))))
            total = p.sum(axis=-1, keepdims=True)
            if threshold:
                head_key = _head_key(keys_ref, b, h, tiling.heads, g)
                p = jnp.where(_keep(head_key, i * bq, kv_tile * bk, (bq, bk), True, threshold), p, 0.0)
            pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)  # the head's lanes hold its output
            if single:
                finish(g, m_next, total, pv)
                continue
            alpha = jnp.exp(m_ref[g] - m_next)
            l_ref[g] = alpha * l_ref[g] + total
            m_ref[g] = m_next
            window.merge(acc_ref, alpha[:, :1] * window.read(acc_ref) + pv)

    if not single:
        @pl.when(j == pl.num_programs(3) - 1)
        def _end():
            for g, window in enumerate(windows):
                finish(g, m_ref[g], l_ref[g], window.read(acc_ref))


def _backward_kernel(keys_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, q_ids_ref, k_ids_ref,
                     dq_ref, dk_ref, dv_ref, *scratch, tiling: Tiling, threshold: int, scale: float):
    """One (row, group of heads, kv tile, j-th q tile it meets) step on transposed [bk, bq] tiles: dk and dv summed
    over the q tiles in the scratch, dq over the kv tiles in a [S, heads x d] scratch that stays for the row and
    group; where a kv tile meets one q tile (S <= 512), straight to the outputs. The keep scale multiplies the
    gradients once at the end rather than every entry: ds = scale x p (kept dp - di / scale). With q, k and dO read
    as the head's own lanes (HeadWindow.own), each gradient is zero in the other heads' lanes: they add up."""
    b, h, t, j = (pl.program_id(axis) for axis in range(4))
    bq, bk = tiling.block_q, tiling.block_k
    q_tile, exists = tiling.partner(t, j, bk, bq)
    last = j == pl.num_programs(3) - 1
    single = not scratch
    windows = [HeadWindow.of(g, tiling.heads, q_ref.shape[-1]) for g in range(tiling.heads)]
    if not single:
        dq_acc_ref, dk_acc_ref, dv_acc_ref = scratch

        @pl.when(jnp.logical_and(t == 0, j == 0))
        def _init_dq():
            dq_acc_ref[...] = jnp.zeros_like(dq_acc_ref)

        @pl.when(j == 0)
        def _init_dkv():
            dk_acc_ref[...] = jnp.zeros_like(dk_acc_ref)
            dv_acc_ref[...] = jnp.zeros_like(dv_acc_ref)

    @pl.when(exists)
    def _tile():
        allowed = _allowed(tiling, q_ids_ref[...], k_ids_ref[...], q_tile * bq, t * bk, False)
        rows = pl.ds(pl.multiple_of(q_tile * bq, bq), bq)
        for g, window in enumerate(windows):
            q, k, v, do = window.own(q_ref), window.own(k_ref), window.read(v_ref), window.own(do_ref)
            s = lax.dot_general(k, q, NT, preferred_element_type=jnp.float32)  # [bk, bq]: transposed logits
            p = jnp.exp(jnp.where(allowed, s, MASKED) - lse_ref[g])
            dp = lax.dot_general(v, do, NT, preferred_element_type=jnp.float32)
            kept = p
            if threshold:
                head_key = _head_key(keys_ref, b, h, tiling.heads, g)
                keep = _keep(head_key, q_tile * bq, t * bk, (bk, bq), False, threshold)
                kept, dp = jnp.where(keep, p, 0.0), jnp.where(keep, dp, 0.0)
            dv = jnp.dot(kept.astype(do.dtype), do, preferred_element_type=jnp.float32)
            ds = (p * (dp - di_ref[g] * (1 / scale))).astype(q.dtype)
            dk = jnp.dot(ds, q, preferred_element_type=jnp.float32)
            dq = lax.dot_general(ds, k, TN, preferred_element_type=jnp.float32)
            if single:
                for ref, grad in ((dq_ref, dq), (dk_ref, dk), (dv_ref, dv)):
                    window.add(ref, (grad * scale).astype(ref.dtype), first_writes=True)
            else:
                window.add(dv_acc_ref, dv)
                window.add(dk_acc_ref, dk)
                window.add(dq_acc_ref, dq, rows)

    if not single:
        @pl.when(last)
        def _end_dkv():
            dk_ref[...] = (dk_acc_ref[...] * scale).astype(dk_ref.dtype)
            dv_ref[...] = (dv_acc_ref[...] * scale).astype(dv_ref.dtype)

        @pl.when(jnp.logical_and(t == pl.num_programs(2) - 1, last))
        def _end_dq():
            dq_ref[...] = (dq_acc_ref[...] * scale).astype(dq_ref.dtype)


def _call(kernel, name: str, grid, in_specs, out_specs, out_shape, scratch, interpret: bool):
    return pl.pallas_call(
        kernel, name=name, out_shape=out_shape, interpret=interpret,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=grid, in_specs=in_specs,
                                               out_specs=out_specs, scratch_shapes=scratch),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary")),
    )


def _stacked(block_shape, which: int, index_map):
    """The block of q (which=0), k (1) or v (2) out of the stacked [3, B, S, heads x d]: the kernel reads the
    projection's output itself, so nothing slices it into three arrays first (a copy of all three)."""
    return pl.BlockSpec((None, *block_shape), lambda *grid: (which, *index_map(*grid)))


def _segment_layouts(segment_ids):
    """[B, S] ids as a query's ids lane-replicated [B, S, LANES] and a key's sublane-replicated [B, SUBLANES, S]."""
    rows, seq = segment_ids.shape
    return (jnp.broadcast_to(segment_ids[:, :, None], (rows, seq, LANES)),
            jnp.broadcast_to(segment_ids[:, None, :], (rows, SUBLANES, seq)))


def _forward(qkv, segment_ids, keys, heads: int, tiling: Tiling, rate: float, interpret: bool):
    _, rows, seq, lanes = qkv.shape
    bq, bk, group = tiling.block_q, tiling.block_k, tiling.heads
    block_lanes = lanes // heads * group
    q_ids, k_ids = _segment_layouts(segment_ids)
    kv_block = lambda b, h, i, j, keys: (b, tiling.partner(i, j, bq, bk)[0], h)
    kernel = functools.partial(_forward_kernel, tiling=tiling, threshold=drop_threshold(rate), scale=keep_scale(rate))
    call = _call(
        kernel, "bert_jax_flash_fwd", grid=(rows, heads // group, seq // bq, tiling.band(bq, bk)),
        in_specs=[_stacked((None, bq, block_lanes), 0, lambda b, h, i, j, keys: (b, i, h)),
                  _stacked((None, bk, block_lanes), 1, kv_block),
                  _stacked((None, bk, block_lanes), 2, kv_block),
                  pl.BlockSpec((None, bq, LANES), lambda b, h, i, j, keys: (b, i, 0)),
                  pl.BlockSpec((None, SUBLANES, bk), lambda b, h, i, j, keys: (b, 0, kv_block(b, h, i, j, keys)[1]))],
        out_specs=[pl.BlockSpec((None, bq, block_lanes), lambda b, h, i, j, keys: (b, i, h)),
                   pl.BlockSpec((None, group, 1, bq), lambda b, h, i, j, keys: (b, h, 0, i))],
        out_shape=[jax.ShapeDtypeStruct(qkv.shape[1:], qkv.dtype),
                   jax.ShapeDtypeStruct((rows, heads, 1, seq), jnp.float32)],
        scratch=[] if tiling.band(bq, bk) == 1 else [pltpu.VMEM((group, bq, LANES), jnp.float32),
                                                     pltpu.VMEM((group, bq, LANES), jnp.float32),
                                                     pltpu.VMEM((bq, block_lanes), jnp.float32)],
        interpret=interpret)
    return call(keys, qkv, qkv, qkv, q_ids, k_ids)


def _backward(qkv, segment_ids, keys, lse, di, do, heads: int, tiling: Tiling, rate: float, interpret: bool):
    _, rows, seq, lanes = qkv.shape
    bq, bk, group = tiling.block_q, tiling.block_k, tiling.heads
    block_lanes = lanes // heads * group
    k_ids, q_ids = _segment_layouts(segment_ids)
    q_tile = lambda t, j: tiling.partner(t, j, bk, bq)[0]
    q_block = lambda b, h, t, j, keys: (b, q_tile(t, j), h)
    kv_block = lambda b, h, t, j, keys: (b, t, h)
    stat_block = lambda b, h, t, j, keys: (b, h, 0, q_tile(t, j))
    kernel = functools.partial(_backward_kernel, tiling=tiling, threshold=drop_threshold(rate),
                               scale=keep_scale(rate))
    call = _call(
        kernel, "bert_jax_flash_bwd", grid=(rows, heads // group, seq // bk, tiling.band(bk, bq)),
        in_specs=[_stacked((None, bq, block_lanes), 0, q_block),
                  _stacked((None, bk, block_lanes), 1, kv_block),
                  _stacked((None, bk, block_lanes), 2, kv_block),
                  pl.BlockSpec((None, bq, block_lanes), q_block),
                  pl.BlockSpec((None, group, 1, bq), stat_block),
                  pl.BlockSpec((None, group, 1, bq), stat_block),
                  pl.BlockSpec((None, SUBLANES, bq), lambda b, h, t, j, keys: (b, 0, q_tile(t, j))),
                  pl.BlockSpec((None, bk, LANES), lambda b, h, t, j, keys: (b, t, 0))],
        out_specs=[pl.BlockSpec((None, seq, block_lanes), lambda b, h, t, j, keys: (b, 0, h)),
                   pl.BlockSpec((None, bk, block_lanes), kv_block),
                   pl.BlockSpec((None, bk, block_lanes), kv_block)],
        out_shape=[jax.ShapeDtypeStruct(qkv.shape[1:], qkv.dtype)] * 3,
        scratch=[] if tiling.pairs() == 1 else [pltpu.VMEM((seq, block_lanes), jnp.float32),
                                                pltpu.VMEM((bk, block_lanes), jnp.float32),
                                                pltpu.VMEM((bk, block_lanes), jnp.float32)],
        interpret=interpret)
    return call(keys, qkv, qkv, qkv, do, lse, di, q_ids, k_ids)


def _per_head_sums(x, heads: int):
    """[B, S, heads x d] summed over each head's d lanes, as [B, heads, 1, S]: a matmul with a [heads x d, heads]
    block of ones, since on TPU splitting the lanes into [heads, d] would copy them into padded rows."""
    lanes = x.shape[-1]
    ones = (jnp.arange(lanes)[:, None] // (lanes // heads) == jnp.arange(heads)[None]).astype(x.dtype)
    return jnp.einsum("bsn,nh->bhs", x, ones)[:, :, None, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _attention(qkv, segment_ids, keys, heads: int, tiling: Tiling, rate: float, interpret: bool):
    return _forward(qkv, segment_ids, keys, heads, tiling, rate, interpret)[0]


def _attention_forward(qkv, segment_ids, keys, heads, tiling, rate, interpret):
    out, lse = _forward(qkv, segment_ids, keys, heads, tiling, rate, interpret)
    return out, (qkv, segment_ids, keys, out, lse)


def _attention_backward(heads, tiling, rate, interpret, residuals, do):
    qkv, segment_ids, keys, out, lse = residuals
    di = _per_head_sums(out.astype(jnp.float32) * do.astype(jnp.float32), heads)
    return jnp.stack(_backward(qkv, segment_ids, keys, lse, di, do, heads, tiling, rate, interpret)), None, None


_attention.defvjp(_attention_forward, _attention_backward)


def flash_attention(qkv, segment_ids, seed, rate: float, heads: int, half_window: int | None = None, row_offset=0,
                    head_offset=0, interpret: bool = False, tiling: Tiling | None = None):
    """softmax(q k^T) v over q, k, v = qkv [3, B, S, heads x d] (q already scaled), a query seeing the keys of its
    own segment id ([B, S] int32) within half_window positions, its probabilities dropped at `rate` by the mask of
    `keep_bits` for `seed` (seed_from); -> [B, S, heads x d]. row_offset and head_offset: the global index of this
    shard's first row and head. `tiling`: another than pick_tiling's (its half_window must be half_window)."""
    _, rows, seq, lanes = qkv.shape
    row_index = jnp.arange(rows, dtype=jnp.uint32) + jnp.asarray(row_offset, jnp.uint32)
    head_index = jnp.arange(heads, dtype=jnp.uint32) + jnp.asarray(head_offset, jnp.uint32)
    keys = head_keys(jnp.asarray(seed, jnp.uint32), row_index[:, None], head_index[None, :])
    keys = lax.bitcast_convert_type(keys, jnp.int32).reshape(-1)  # scalar prefetch takes int32, flat fits SMEM
    tiling = pick_tiling(seq, heads, lanes // heads, half_window) if tiling is None else tiling
    return _attention(qkv, segment_ids.astype(jnp.int32), keys, heads, tiling, rate, interpret)
