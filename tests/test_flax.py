"""jax_flash.flax: the drop-in attention_fn inside Flax's own attention layers, and jax_flash's linen/nnx layers.

* attention_fn in flax.linen.MultiHeadDotProductAttention and flax.nnx.MultiHeadAttention gives the default layer's
  outputs and gradients (same params, float32), and its jitted computation calls jax_flash's kernels;
* jax_flash.flax.{linen,nnx}.Attention match a float64 jnp reference written from their own params (GQA, causal,
  window, softcap, rotary embeddings, biases);
* what the kernels cannot do (mask arrays, bias, dropout, sowing weights, custom einsums) raises, saying what to use;
* the layers run under jit and in bfloat16; jax_flash and attention_fn work without flax installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at

pytest.importorskip("flax", reason="jax_flash.flax's tests need flax (pip install 'jax_flash[flax]')")
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jax_flash.flax as jff  # noqa: E402

BATCH, SEQ, FEATURES, HEADS = 2, 12, 32, 4
# float32 results vs float32 Flax / the float64 reference, as a fraction of the largest reference magnitude of each
# array: observed errors are ~1e-7..1e-6 (a few float32 roundings through four matmuls and the softmax).
FLOAT32_TOLERANCE = 1e-5
# bfloat16 vs float32: several bf16 roundings (projections, kernel inputs and output); observed up to ~1.3 eps.
BFLOAT16_TOLERANCE = 4 * float(jnp.finfo(jnp.bfloat16).eps)


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """Flax's own layers (and all projections) in true float32: on GPUs XLA's default would be TF32, far looser than
    the tolerances here. Read when computations are traced, so it covers jit and autodiff."""
    with jax.default_matmul_precision("highest"):
        yield


def _normal(rng, shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _prng_key(rng):
    return jax.random.key(int(rng.integers(2**31)))


def _assert_trees_close(actual, expected, tolerance, what):
    """Same tree structure, shapes and finiteness; |actual - expected| <= tolerance * scale per leaf.

    The scale is the leaf's max|expected|, except for a leaf that is zero up to rounding next to the rest of the tree
    (max|expected| < 1e-4 * the tree's): the key projection's bias gets a zero gradient in exact arithmetic (the
    softmax ignores a shift shared by all keys), so both sides hold rounding residue, at the tree's scale.
    """
    actual_leaves, actual_tree = jax.tree.flatten_with_path(actual)
    expected_leaves, expected_tree = jax.tree.flatten_with_path(expected)
    assert [p for p, _ in actual_leaves] == [p for p, _ in expected_leaves], (actual_tree, expected_tree)
    tree_scale = max(np.max(np.abs(np.asarray(e, np.float64))) for _, e in expected_leaves)
    assert tree_scale > 0, f"{what}: the expected values are all zeros, which would make the comparison vacuous"
    for (path, a), (_, e) in zip(actual_leaves, expected_leaves):
        name = f"{what}{jax.tree_util.keystr(path)}"
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        assert a.shape == e.shape, f"{name}: shape {a.shape}, expected {e.shape}"
        assert np.all(np.isfinite(a)), f"{name}: non-finite values"
        scale = np.max(np.abs(e))
        scale = tree_scale if scale < 1e-4 * tree_scale else scale
        error = np.max(np.abs(a - e))
        assert error <= tolerance * scale, f"{name}: max error {error:.3e} > {tolerance} * max|expected| {scale:.3e}"


def _output_and_grads(apply, params, inputs, cotangent):
    """apply(params, *inputs) and the gradients of sum(output * cotangent) w.r.t. params and inputs."""
    output, vjp = jax.vjp(apply, params, *inputs)
    return output, vjp(cotangent.astype(output.dtype))


def _jit_through_kernels(fn, *args):
    """jit(fn)(*args), after checking that its lowering calls jax_flash's forward and backward kernels: a comparison
    cannot pass by Flax (or a fallback) silently running some other attention."""
    return at.run_flash_checked(fn, args, jax.default_backend(), ops=("fwd", "bwd"))


# ---------------------------------------------------------------------------------------------------------------------
# (a) attention_fn inside flax.linen.MultiHeadDotProductAttention.

LINEN_CASES = {
    "self": dict(kv_len=None, causal=False),
    "causal": dict(kv_len=None, causal=True),
    "cross_attention": dict(kv_len=7, causal=False),  # key/value from another sequence, of another length
}


@pytest.mark.parametrize("case", list(LINEN_CASES))
def test_linen_multi_head_attention_matches_flax(rng, case):
    kv_len, causal = LINEN_CASES[case]["kv_len"], LINEN_CASES[case]["causal"]
    inputs = (_normal(rng, (BATCH, SEQ, FEATURES)),)
    if kv_len is not None:
        inputs += (_normal(rng, (BATCH, kv_len, FEATURES)),)
    cotangent = _normal(rng, (BATCH, SEQ, FEATURES))
    flax_layer = nn.MultiHeadDotProductAttention(num_heads=HEADS)
    flash_layer = nn.MultiHeadDotProductAttention(
        num_heads=HEADS, attention_fn=jff.make_attention_fn(is_causal=True) if causal else jff.attention_fn)
    params = flax_layer.init(_prng_key(rng), *inputs)["params"]
    mask = nn.make_causal_mask(inputs[0][..., 0]) if causal else None

    def flax_fn(params, *inputs):
        return _output_and_grads(lambda p, *x: flax_layer.apply({"params": p}, *x, mask=mask), params, inputs,
                                 cotangent)

    def flash_fn(params, *inputs):
        return _output_and_grads(lambda p, *x: flash_layer.apply({"params": p}, *x), params, inputs, cotangent)

    got = _jit_through_kernels(flash_fn, params, *inputs)
    want = jax.jit(flax_fn)(params, *inputs)
    _assert_trees_close(got, want, FLOAT32_TOLERANCE, f"linen {case}: (output, (d params, d inputs))")


@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_attention_fn_batch_axes(rng, batch_shape):
    """Flax's layout allows any number of batch axes, the kernels exactly one: none and two are folded and unfolded."""
    q, k, v = (_normal(rng, (*batch_shape, SEQ, HEADS, 8)) for _ in range(3))
    _assert_trees_close(jff.attention_fn(q, k, v), nn.dot_product_attention(q, k, v), FLOAT32_TOLERANCE,
                        f"batch axes {batch_shape}")


# ---------------------------------------------------------------------------------------------------------------------
# (b) attention_fn inside flax.nnx.MultiHeadAttention.

NNX_CASES = {
    "self": dict(num_kv_heads=None, causal_fn=False, causal_call=False),
    "causal_attention_fn": dict(num_kv_heads=None, causal_fn=True, causal_call=False),  # vs Flax with a causal mask
    "causal_call_argument": dict(num_kv_heads=None, causal_fn=False, causal_call=True),  # layer(x, is_causal=True)
    "grouped_query_causal": dict(num_kv_heads=2, causal_fn=False, causal_call=True),
}


def _split_params(layer):
    """(apply(params, x), params) of an nnx layer, so that jax.vjp differentiates w.r.t. its parameters."""
    graph, params = nnx.split(layer, nnx.Param)
    return lambda params, *args, **kwargs: nnx.merge(graph, params)(*args, **kwargs), params


@pytest.mark.parametrize("case", list(NNX_CASES))
def test_nnx_multi_head_attention_matches_flax(rng, case):
    num_kv_heads, causal_fn, causal_call = (NNX_CASES[case][k] for k in ("num_kv_heads", "causal_fn", "causal_call"))
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    cotangent = _normal(rng, (BATCH, SEQ, FEATURES))

    def layer(**kwargs):
        return nnx.MultiHeadAttention(HEADS, FEATURES, num_kv_heads=num_kv_heads, decode=False, keep_rngs=False,
                                      rngs=nnx.Rngs(int(rng.integers(2**31))), **kwargs)

    flax_layer = layer()
    flash_layer = layer(attention_fn=jff.make_attention_fn(is_causal=causal_fn))
    nnx.update(flash_layer, nnx.state(flax_layer, nnx.Param))  # the two seeds differ: same params from here
    flax_apply, params = _split_params(flax_layer)
    flash_apply, _ = _split_params(flash_layer)
    flax_kwargs = dict(mask=nnx.make_causal_mask(x[..., 0]) if causal_fn else None, is_causal=causal_call)

    def flax_fn(params, x):
        return _output_and_grads(lambda p, x: flax_apply(p, x, **flax_kwargs), params, (x,), cotangent)

    def flash_fn(params, x):
        return _output_and_grads(lambda p, x: flash_apply(p, x, is_causal=causal_call), params, (x,), cotangent)

    got = _jit_through_kernels(flash_fn, params, x)
    want = jax.jit(flax_fn)(params, x)
    _assert_trees_close(got, want, FLOAT32_TOLERANCE, f"nnx {case}: (output, (d params, d x))")


# ---------------------------------------------------------------------------------------------------------------------
# (c) jax_flash's own layers vs a float64 jnp reference built from their parameters.

LAYER_CASES = {
    "gqa_causal_rotary": dict(num_heads=4, num_kv_heads=2, is_causal=True, use_rotary=True),
    "mqa_window_softcap": dict(num_heads=4, num_kv_heads=1, local_window_size=(3, 1), softcap=2.0),
    "bias_head_dim_rotary_positions": dict(num_heads=2, head_dim=24, use_bias=True, use_rotary=True, rope_base=500.0,
                                           local_window_size=4),
}


def _rotary_reference(x, positions, base):
    """Rotary embedding as complex multiplication: features (i, i + head_dim/2) are one complex number, turned by
    exp(1j * position * base**(-2i/head_dim)). Written independently of jax_flash.flax.rotary."""
    half = x.shape[-1] // 2
    frequencies = base ** (-2.0 * np.arange(half) / x.shape[-1])
    turn = jnp.exp(1j * jnp.asarray(positions, jnp.float64)[..., None, None] * frequencies)  # [.., seq, 1, half]
    rotated = (x[..., :half] + 1j * x[..., half:]) * turn
    return jnp.concatenate([rotated.real, rotated.imag], axis=-1)


def _reference_layer(params, x, positions, *, num_heads, num_kv_heads=None, head_dim=None, is_causal=False,
                     local_window_size=None, softcap=None, use_rotary=False, rope_base=10000.0, use_bias=False):
    """The layer computed in float64 with plain jnp: K/V heads repeated for GQA, the S x S logits masked."""

    def project(name, x, spec):
        out = jnp.einsum(spec, x, params[name]["kernel"])
        return out + params[name]["bias"] if use_bias else out

    q = project("query", x, "bsf,fhd->bshd")
    k = project("key", x, "bsf,fhd->bshd")
    v = project("value", x, "bsf,fhd->bshd")
    if use_rotary:
        q, k = _rotary_reference(q, positions, rope_base), _rotary_reference(k, positions, rope_base)
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)  # query head h reads kv head h // group
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if softcap:
        logits = softcap * jnp.tanh(logits / softcap)
    left, right = at.window_bounds(is_causal, local_window_size)
    visible = at.visible_mask(x.shape[1], x.shape[1], left, right)
    probs = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
    return project("out", jnp.einsum("bhqk,bkhd->bqhd", probs, v), "bqhd,hdf->bqf")


def _linen_layer(config, x, key):
    layer = jff.linen.Attention(**config)
    params = layer.init(key, x)["params"]
    return (lambda params, x, positions=None, **kwargs: layer.apply({"params": params}, x, positions, **kwargs),
            params)


def _nnx_layer(config, x, key):
    config = dict(config)
    layer = jff.nnx.Attention(x.shape[-1], config.pop("num_heads"), **config, rngs=nnx.Rngs(params=key))
    return _split_params(layer)


LAYER_BUILDERS = {"linen": _linen_layer, "nnx": _nnx_layer}


def _plain(params):
    """nnx's State of params as the nested dict that linen's params already are."""
    return nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params


def _to_float64_dict(params):
    return jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), _plain(params))


@pytest.mark.parametrize("case", list(LAYER_CASES))
@pytest.mark.parametrize("framework", list(LAYER_BUILDERS))
def test_attention_layer_matches_reference(rng, framework, case):
    config = LAYER_CASES[case]
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    cotangent = _normal(rng, (BATCH, SEQ, FEATURES))
    # Custom positions (a different offset per batch row) where the case names them; the default 0..seq-1 otherwise.
    positions = (jnp.arange(SEQ)[None] + jnp.asarray(rng.integers(0, 100, (BATCH, 1)))) if "positions" in case else None
    apply, params = LAYER_BUILDERS[framework](config, x, _prng_key(rng))
    reference_positions = jnp.arange(SEQ) if positions is None else positions

    def layer_fn(p, x):
        return _output_and_grads(lambda p, x: apply(p, x, positions), p, (x,), cotangent)

    def reference_fn(p, x):
        return _output_and_grads(lambda p, x: _reference_layer(p, x, reference_positions, **config), p, (x,),
                                 cotangent.astype(jnp.float64))

    out, (d_params, d_x) = _jit_through_kernels(layer_fn, params, x)
    assert out.shape == x.shape and out.dtype == jnp.float32
    ref_out, (ref_d_params, ref_d_x) = jax.jit(reference_fn)(_to_float64_dict(params), jnp.asarray(x, jnp.float64))
    _assert_trees_close((out, _plain(d_params), d_x), (ref_out, ref_d_params, ref_d_x),
                        FLOAT32_TOLERANCE, f"{framework} {case}: (output, d params, d x)")


def test_rotary_embedding_changes_the_output(rng):
    """Rotary attention sees only position offsets: shifting every position by 37 leaves the output as it was, while
    the same layer without the rotation gives another output (so the rotation is neither lost nor absolute)."""
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = jff.linen.Attention(num_heads=HEADS, is_causal=True, use_rotary=True)
    params = layer.init(_prng_key(rng), x)
    out = layer.apply(params, x)
    shifted = layer.apply(params, x, jnp.arange(SEQ) + 37)
    without_rotary = layer.clone(use_rotary=False).apply(params, x)
    _assert_trees_close(shifted, out, FLOAT32_TOLERANCE, "positions shifted by 37")
    assert np.max(np.abs(np.asarray(without_rotary - out))) > 1e-2 * np.max(np.abs(np.asarray(out)))


@pytest.mark.parametrize("framework", list(LAYER_BUILDERS))
def test_packed_documents_match_separate_calls(rng, framework):
    """Two documents packed in one row, then padding: with segment ids, segment positions (also the rotary
    positions) and the row's length, each document's output is the layer's output on that document alone, and the
    padding's is the output projection's bias (attention gives 0 there)."""
    config = dict(num_heads=HEADS, num_kv_heads=2, is_causal=True, use_rotary=True, use_bias=True)
    lengths = (5, 4)  # then SEQ - 9 padding tokens
    x = _normal(rng, (1, SEQ, FEATURES))
    apply, params = LAYER_BUILDERS[framework](config, x, _prng_key(rng))
    ids = np.array([[0] * lengths[0] + [1] * lengths[1] + [2] * (SEQ - sum(lengths))], np.int32)
    positions = np.array([[*range(lengths[0]), *range(lengths[1]), *range(SEQ - sum(lengths))]], np.int32)
    packed = at.run_flash_checked(
        lambda p, x: apply(p, x, segment_ids=ids, segment_positions=positions,
                           seq_lengths=np.array([sum(lengths)], np.int32)), (params, x), jax.default_backend())
    first = jax.jit(apply)(params, x[:, :lengths[0]])
    second = jax.jit(apply)(params, x[:, lengths[0]:sum(lengths)])
    used = sum(lengths)
    _assert_trees_close(packed[:, :lengths[0]], first, FLOAT32_TOLERANCE, f"{framework} first document")
    _assert_trees_close(packed[:, lengths[0]:used], second, FLOAT32_TOLERANCE, f"{framework} second document")
    out_bias = np.asarray(_plain(params)["out"]["bias"])
    np.testing.assert_array_equal(packed[0, used:], np.broadcast_to(out_bias, (SEQ - used, FEATURES)))


# ---------------------------------------------------------------------------------------------------------------------
# (d) Options the kernels cannot honour raise, naming what to use instead.


def _qkv(rng):
    return tuple(_normal(rng, (BATCH, SEQ, HEADS, 8)) for _ in range(3))


MASK_MESSAGE = r"does not take a mask array.*make_attention_fn\(is_causal=True\) instead of a make_causal_mask"


def test_linen_mask_is_refused(rng):
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=jff.attention_fn)
    with pytest.raises(NotImplementedError, match=MASK_MESSAGE):
        layer.init(_prng_key(rng), x, mask=nn.make_causal_mask(x[..., 0]))


def test_nnx_mask_is_refused(rng):
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, attention_fn=jff.attention_fn, rngs=nnx.Rngs(0))
    with pytest.raises(NotImplementedError, match=MASK_MESSAGE):
        layer(x, mask=nnx.make_causal_mask(x[..., 0]))


def test_bias_is_refused(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(NotImplementedError, match=r"does not support an attention bias.*default attention_fn"):
        jff.attention_fn(q, k, v, bias=_normal(rng, (BATCH, HEADS, SEQ, SEQ)))


def test_linen_dropout_is_refused_unless_deterministic(rng):
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = nn.MultiHeadDotProductAttention(num_heads=HEADS, dropout_rate=0.1, attention_fn=jff.attention_fn)
    keys = {"params": _prng_key(rng), "dropout": _prng_key(rng)}
    with pytest.raises(NotImplementedError, match=r"does not support attention dropout \(dropout_rate=0.1 with "
                                                  r"deterministic=False\): set the layer's dropout_rate=0"):
        layer.init(keys, x, deterministic=False)
    # deterministic=True turns dropout off, which the kernels can do: the same output as without dropout.
    params = layer.init(keys, x, deterministic=True)
    without_dropout = nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=jff.attention_fn)
    _assert_trees_close(layer.apply(params, x, deterministic=True), without_dropout.apply(params, x),
                        FLOAT32_TOLERANCE, "deterministic output")


def test_nnx_dropout_is_refused(rng):
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, dropout_rate=0.25, attention_fn=jff.attention_fn,
                                   rngs=nnx.Rngs(0))
    with pytest.raises(NotImplementedError, match=r"does not support attention dropout \(dropout_rate=0.25"):
        layer(x, deterministic=False)
    assert layer(x, deterministic=True).shape == x.shape


def test_sow_weights_is_refused(rng):
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    layer = nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=jff.attention_fn)
    with pytest.raises(NotImplementedError, match=r"cannot sow attention weights \(sow_weights=True\)"):
        layer.init(_prng_key(rng), x, sow_weights=True)


def test_custom_einsum_is_refused(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(NotImplementedError, match=r"cannot use custom einsums or dot_generals"):
        jff.attention_fn(q, k, v, qk_attn_weights_einsum=jnp.einsum, attn_weights_value_einsum=jnp.einsum)


LAYER_ERRORS = {
    "kv_heads_not_divisor": (dict(num_heads=4, num_kv_heads=3), None,
                             r"num_kv_heads \(3\) must be a positive divisor of num_heads \(4\)"),
    "features_not_multiple": (dict(num_heads=5), None, r"features \(32\) is not a multiple of num_heads \(5\)"),
    "odd_head_dim_rotary": (dict(num_heads=4, head_dim=7, use_rotary=True), None, r"head_dim must be even, got 7"),
    "positions_without_rotary": (dict(num_heads=4), np.arange(SEQ), r"construct the layer with use_rotary=True"),
}


@pytest.mark.parametrize("case", list(LAYER_ERRORS))
@pytest.mark.parametrize("framework", ["linen", "nnx"])
def test_layer_argument_errors(rng, framework, case):
    config, positions, message = LAYER_ERRORS[case]
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    with pytest.raises(ValueError, match=message):
        apply, params = LAYER_BUILDERS[framework](config, x, _prng_key(rng))
        apply(params, x, positions)


def test_without_flax(tmp_path):
    """With flax unimportable, jax_flash and attention_fn still work, and the layers name the missing install."""
    script = textwrap.dedent("""
        import sys
        sys.modules["flax"] = None  # what an environment without flax looks like to an import
        import numpy as np
        import jax_flash, jax_flash.flax
        q = np.random.default_rng(0).standard_normal((2, 5, 2, 8)).astype(np.float32)
        out = jax_flash.flax.attention_fn(q, q, q)
        assert out.shape == q.shape and np.all(np.isfinite(out)), out
        try:
            jax_flash.flax.linen
        except ModuleNotFoundError as error:
            print(error)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "jax_flash's Flax layers need flax, which is not installed: pip install 'jax_flash[flax]'" in result.stdout


# ---------------------------------------------------------------------------------------------------------------------
# (e) Under jit, and in bfloat16.


@pytest.mark.parametrize("framework", list(LAYER_BUILDERS))
def test_layer_jit_and_bfloat16(rng, framework):
    config = dict(num_heads=HEADS, num_kv_heads=2, is_causal=True, use_rotary=True, softcap=3.0)
    x = _normal(rng, (BATCH, SEQ, FEATURES))
    cotangent = _normal(rng, (BATCH, SEQ, FEATURES))
    key = _prng_key(rng)
    apply, params = LAYER_BUILDERS[framework](config, x, key)
    bf16_apply, bf16_params = LAYER_BUILDERS[framework](dict(config, dtype=jnp.bfloat16), x, key)
    # param_dtype stays float32, and the same key gives the same parameters.
    _assert_trees_close(bf16_params, params, 0.0, "bfloat16 layer's params")

    eager = _output_and_grads(apply, params, (x,), cotangent)
    jitted = jax.jit(lambda p, x: _output_and_grads(apply, p, (x,), cotangent))(params, x)
    _assert_trees_close(jitted, eager, FLOAT32_TOLERANCE, f"{framework} jit vs eager")

    bf16 = _jit_through_kernels(lambda p, x: _output_and_grads(bf16_apply, p, (x,), cotangent), params, x)
    assert bf16[0].dtype == jnp.bfloat16, bf16[0].dtype
    _assert_trees_close(bf16, jitted, BFLOAT16_TOLERANCE, f"{framework} bfloat16 vs float32")
