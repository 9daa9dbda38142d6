"""Token generation with a KV cache: a small decoder-only transformer (random weights) generating greedily in one
jitted lax.fori_loop, with attention by jax_flash.decode_attention or by jax.nn.dot_product_attention.

    python examples/generate.py [--batch 8] [--prompt 32] [--steps 128] [--layers 4]

Both variants prefill the prompt (jax_flash: one decode_attention call with q_len = prompt length on the freshly
written cache; jax.nn: causal attention over the prompt), then generate one token per step: write the new K/V into
the cache (jax_flash.update_kv_cache, in place; jax.nn: lax.dynamic_update_slice) and attend to the valid entries.
Prints tokens per second for each and how many generated tokens the two agree on (rounding can flip a near-tie).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_flash


def init_params(rng, *, vocab, layers, d_model, heads, kv_heads, head_dim, dtype):
    def dense(*shape):
        return jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), dtype)

    return dict(
        embed=jnp.asarray(rng.standard_normal((vocab, d_model)), dtype),
        layers=[dict(wq=dense(d_model, heads * head_dim), wk=dense(d_model, kv_heads * head_dim),
                     wv=dense(d_model, kv_heads * head_dim), wo=dense(heads * head_dim, d_model),
                     w1=dense(d_model, 4 * d_model), w2=dense(4 * d_model, d_model)) for _ in range(layers)],
    )


def rms_norm(x):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def rotary(x, positions):
    """Rotary position embedding of x [B, T, H, D] at positions [B, T]."""
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angle = positions[..., None, None].astype(jnp.float32) * freq
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def jax_flash_attention(q, k, v, cache, start):
    """Writes k/v [B, T, Hkv, D] at positions start.. and attends q [B, T, H, D] to the cache (causal)."""
    k_cache, v_cache = jax_flash.update_kv_cache(*cache, k, v, start)
    return jax_flash.decode_attention(q, k_cache, v_cache, start + q.shape[1]), (k_cache, v_cache)


def jax_nn_attention(q, k, v, cache, start):
    """The same with jax.nn: causal attention within a prompt (start 0), or one query against the cache."""
    k_cache, v_cache = (jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice_in_dim(c, x, s, 0))(c, x, start)
                        for c, x in ((cache[0], k), (cache[1], v)))
    if q.shape[1] > 1:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True), (k_cache, v_cache)
    out = jax.nn.dot_product_attention(q, k_cache, v_cache, key_value_seq_lengths=start + 1)
    return out, (k_cache, v_cache)


def forward(params, tokens, caches, start, *, attention, heads, kv_heads, head_dim):
    """Logits of the last position of tokens [B, T] (at positions start..start+T-1) and the updated caches."""
    batch, length = tokens.shape
    positions = start[:, None] + jnp.arange(length)[None, :]
    x = params["embed"][tokens]
    new_caches = []
    for layer, cache in zip(params["layers"], caches):
        h = rms_norm(x)
        q = rotary((h @ layer["wq"]).reshape(batch, length, heads, head_dim), positions)
        k = rotary((h @ layer["wk"]).reshape(batch, length, kv_heads, head_dim), positions)
        v = (h @ layer["wv"]).reshape(batch, length, kv_heads, head_dim)
        out, cache = attention(q, k, v, cache, start)
        new_caches.append(cache)
        x = x + out.reshape(batch, length, heads * head_dim) @ layer["wo"]
        x = x + jax.nn.gelu(rms_norm(x) @ layer["w1"]) @ layer["w2"]
    return (rms_norm(x[:, -1]) @ params["embed"].T).astype(jnp.float32), new_caches


@functools.partial(jax.jit, static_argnames=("attention", "steps", "max_len", "heads", "kv_heads", "head_dim"))
def generate(params, prompt, *, attention, steps, max_len, heads, kv_heads, head_dim):
    batch, prompt_len = prompt.shape
    dtype = params["embed"].dtype
    shape = (batch, max_len, kv_heads, head_dim)
    caches = [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in params["layers"]]
    model = functools.partial(forward, params, attention=attention, heads=heads, kv_heads=kv_heads,
                              head_dim=head_dim)
    logits, caches = model(prompt, caches, jnp.zeros(batch, jnp.int32))
    tokens = jnp.zeros((batch, steps), jnp.int32).at[:, 0].set(jnp.argmax(logits, -1))

    def step(i, carry):
        tokens, caches = carry
        start = jnp.full((batch,), prompt_len + i - 1, jnp.int32)
        logits, caches = model(jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1), caches, start)
        return tokens.at[:, i].set(jnp.argmax(logits, -1)), caches

    return jax.lax.fori_loop(1, steps, step, (tokens, caches))[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description="KV-cache generation with jax_flash vs jax.nn")
    on_gpu = jax.devices()[0].platform == "gpu"
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=256 if on_gpu else 48)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16 if on_gpu else 8)
    parser.add_argument("--kv-heads", type=int, default=4 if on_gpu else 2)
    parser.add_argument("--head-dim", type=int, default=128 if on_gpu else 32)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args(argv)
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    d_model = args.heads * args.head_dim
    rng = np.random.default_rng(0)
    params = init_params(rng, vocab=args.vocab, layers=args.layers, d_model=d_model, heads=args.heads,
                         kv_heads=args.kv_heads, head_dim=args.head_dim, dtype=dtype)
    prompt = jnp.asarray(rng.integers(0, args.vocab, (args.batch, args.prompt)), jnp.int32)
    max_len = -(-(args.prompt + args.steps) // 16) * 16
    print(f"{jax.devices()[0].device_kind}: batch {args.batch}, prompt {args.prompt}, {args.steps} new tokens, "
          f"{args.layers} layers, {args.heads}/{args.kv_heads} heads of {args.head_dim}, {jnp.dtype(dtype).name}")
    results = {}
    for name, attention in (("jax_flash", jax_flash_attention), ("jax.nn", jax_nn_attention)):
        run = functools.partial(generate, params, prompt, attention=attention, steps=args.steps, max_len=max_len,
                                heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim)
        run().block_until_ready()  # compile
        start = time.perf_counter()
        results[name] = np.asarray(run().block_until_ready())
        seconds = time.perf_counter() - start
        print(f"  {name:9s} {args.batch * args.steps / seconds:10.1f} tokens/s  ({seconds * 1e3:.1f} ms)")
    agree = np.mean(results["jax_flash"] == results["jax.nn"])
    print(f"  generated tokens equal in both: {100 * agree:.1f}%")


if __name__ == "__main__":
    main()
