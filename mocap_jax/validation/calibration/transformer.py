"""The measured workload: chunked prefill of a small Llama-style transformer (a flash-attention style
loop over a preallocated KV cache for the prefix, causal query blocks for the chunk itself)."""

from __future__ import annotations

import numpy as np

from ...specs import ModelSpec


def normal_source(seed: int, on_device: bool):
    """``normal(shape, dtype, scale)``: numpy's generator on a CPU (no per-shape compiles), jax.random on device."""
    import jax
    import jax.numpy as jnp

    if on_device:
        state = {"key": jax.random.key(seed)}

        def normal(shape, dtype, scale=1.0):
            state["key"], k = jax.random.split(state["key"])
            return (jax.random.normal(k, shape, jnp.float32) * scale).astype(dtype)
    else:
        rng = np.random.default_rng(seed)

        def normal(shape, dtype, scale=1.0):
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(scale)
            return jnp.asarray(x, dtype=dtype)
    return normal


def init_weights(model: ModelSpec, dtype, seed: int = 0, on_device: bool = False):
    """Random weights of ``model.layers`` stacked Llama blocks (a dict of ``[L, ...]`` arrays)."""
    import jax.numpy as jnp

    L, d, f = model.layers, model.hidden, model.ffn
    qd, kvd = model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    normal = normal_source(seed, on_device)
    return {
        "ln1": jnp.ones((L, d), dtype),
        "ln2": jnp.ones((L, d), dtype),
        "wqkv": normal((L, d, qd + 2 * kvd), dtype, d ** -0.5),
        "wo": normal((L, qd, d), dtype, qd ** -0.5),
        "w13": normal((L, d, 2 * f), dtype, d ** -0.5),
        "w2": normal((L, f, d), dtype, f ** -0.5),
    }


def build_chunk_fn(model: ModelSpec, dtype, kv_block: int, q_block: int, q_rows: int = 0):
    """A jitted ``f(weights, x, k_cache, v_cache, p) -> (y, (k_new, v_new))``: one chunk through all blocks.

    ``x`` is ``[B, c, hidden]``; the caches are ``[L, B, kv_heads, S_max, head_dim]`` (head-major, as paged
    KV caches are) with the first ``p`` positions valid (``p`` an int32 scalar, traced: one executable per
    input shape serves every prefix length); ``k_new``/``v_new`` are ``[L, B, kv_heads, c, head_dim]``, the
    chunk's entries for the cache.

    Attention, per KV head, treats the ``c x (q_heads / kv_heads)`` queries of the group as the rows of one
    matrix (token-major).  The prefix is read in ``kv_block``-token steps of a loop whose trip count is
    ``ceil(p / kv_block)``, with an online softmax in float32, for row tiles of ``q_rows`` rows (0: all rows
    at once); the chunk then attends to itself causally in query blocks of ``q_block`` tokens, each reading
    only the keys up to its own end.
    """
    import jax
    import jax.numpy as jnp

    if q_block <= 0 or kv_block <= 0 or q_rows < 0:
        raise ValueError("q_block and kv_block must be positive and q_rows >= 0")
    Hq, Hkv, hd = model.q_heads, model.kv_heads, model.head_dim
    g = Hq // Hkv
    f32 = jnp.promote_types(dtype, jnp.float32)  # softmax statistics, norms and RoPE: at least float32
    neg = jnp.asarray(-1e30, f32)
    half = hd // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) * 2.0 / hd))

    def rmsnorm(x, w):
        xf = x.astype(f32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(dtype) * w

    def rope(x, pos):  # x [B, c, H, hd], pos [c]
        ang = pos.astype(f32)[:, None] * jnp.asarray(inv_freq, f32)[None, :]
        cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
        x1, x2 = x[..., :half].astype(f32), x[..., half:].astype(f32)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(dtype)

    def update(state, q, kb, vb, mask):
        m, l, acc = state  # m, l: [B, Hkv, R]; acc: [B, Hkv, R, hd]; q [B, Hkv, R, hd]; kb, vb [B, Hkv, K, hd]
        s = jnp.einsum("bhrd,bhkd->bhrk", q, kb, preferred_element_type=f32)
        s = jnp.where(mask, s, neg)
        m_new = jnp.maximum(m, s.max(-1))
        alpha = jnp.exp(m - m_new)
        pr = jnp.exp(s - m_new[..., None])
        l = l * alpha + pr.sum(-1)
        pv = jnp.einsum("bhrk,bhkd->bhrd", pr.astype(dtype), vb, preferred_element_type=f32)
        return m_new, l, acc * alpha[..., None] + pv

    def attention(q, k, v, kc, vc, layer, p):
        # kc, vc: the whole [L, B, Hkv, S, hd] caches; only kv_block-token blocks of layer ``layer`` are read
        # (slicing a layer out first would make XLA copy all S_max positions of it on every call).
        # q [B, c, Hq, hd] -> rows (token, group member) per KV head: [B, Hkv, c*g, hd]
        B, c = q.shape[:2]
        R = c * g
        q = (q * jnp.asarray(hd ** -0.5, dtype)).reshape(B, c, Hkv, g, hd).transpose(0, 2, 1, 3, 4)
        q = q.reshape(B, Hkv, R, hd)
        kv_pos = jnp.arange(kv_block, dtype=jnp.int32)
        n_blocks = ((p + kv_block - 1) // kv_block).astype(jnp.int32)
        tile = R if q_rows == 0 else max(g, min(R, (q_rows // g) * g))
        states = []
        for lo in range(0, R, tile):  # prefix, one row tile at a time
            qt = q[:, :, lo:lo + tile]
            r = qt.shape[2]
            st0 = (jnp.full((B, Hkv, r), neg, f32), jnp.zeros((B, Hkv, r), f32), jnp.zeros((B, Hkv, r, hd), f32))

            def prefix_step(j, st, qt=qt):
                start = j * kv_block
                zero = jnp.zeros((), jnp.int32)
                at, size = (layer, zero, zero, start, zero), (1, B, Hkv, kv_block, hd)
                kb = jax.lax.dynamic_slice(kc, at, size)[0]
                vb = jax.lax.dynamic_slice(vc, at, size)[0]
                return update(st, qt, kb, vb, (start + kv_pos) < p)

            states.append(jax.lax.fori_loop(jnp.int32(0), n_blocks, prefix_step, st0))
        state = tuple(jnp.concatenate(parts, 2) for parts in zip(*states))
        qb = min(q_block, c)
        outs = []
        for i in range(-(-c // qb)):  # the chunk against itself, causal, each block up to its own end
            lo, hi = i * qb, min((i + 1) * qb, c)
            rows = slice(lo * g, hi * g)
            st = (state[0][:, :, rows], state[1][:, :, rows], state[2][:, :, rows])
            tok = lo + jnp.arange((hi - lo) * g, dtype=jnp.int32) // g
            mask = jnp.arange(hi, dtype=jnp.int32)[None, :] <= tok[:, None]
            _, l, acc = update(st, q[:, :, rows], k[:, :, :hi], v[:, :, :hi], mask)
            outs.append(acc / l[..., None])
        o = jnp.concatenate(outs, 2).reshape(B, Hkv, c, g, hd).transpose(0, 2, 1, 3, 4)
        return o.reshape(B, c, Hq * hd).astype(dtype)

    def block(x, w, kc, vc, layer, p):
        B, c, _ = x.shape
        h = rmsnorm(x, w["ln1"])
        q, k, v = jnp.split(h @ w["wqkv"], [Hq * hd, (Hq + Hkv) * hd], -1)
        pos = p + jnp.arange(c, dtype=jnp.int32)
        q = rope(q.reshape(B, c, Hq, hd), pos)
        k = rope(k.reshape(B, c, Hkv, hd), pos).transpose(0, 2, 1, 3)  # [B, Hkv, c, hd]
        v = v.reshape(B, c, Hkv, hd).transpose(0, 2, 1, 3)
        x = x + attention(q, k, v, kc, vc, layer, p) @ w["wo"]
        h = rmsnorm(x, w["ln2"])
        a, b = jnp.split(h @ w["w13"], 2, -1)
        x = x + (jax.nn.silu(a) * b) @ w["w2"]
        return x, (k, v)

    def chunk(weights, x, k_cache, v_cache, p):
        layers = jnp.arange(k_cache.shape[0], dtype=jnp.int32)
        return jax.lax.scan(lambda x, xs: block(x, xs[0], k_cache, v_cache, xs[1], p), x, (weights, layers))

    return jax.jit(chunk)


# --------------------------------------------------------------------------- clocks and device peaks

# XLA:CPU flags of the isolated measurement process: one thread for everything.
