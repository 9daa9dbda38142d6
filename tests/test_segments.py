"""Sequence lengths, segment ids (packed documents) and segment positions.

jax_flash is compared, forward and gradients, with the independent float64 numpy attention of attention_testing
given a visibility mask built here in numpy from the layout, under the suite's tolerance rule. The same-dtype baseline
is jax_flash's implementation='xla' (jax.nn has no segment ids). Layouts are random: 1 to 20 documents of random
lengths per row, then padding, over sequences that span several kernel tiles so that empty, partial and full blocks
all occur. Every case runs on each platform with kernels (conftest.py): the CPU kernels, and the CUDA kernels where a
GPU is present (float32 on the simple kernels, bfloat16 / float16 on the tensor-core kernels, whose tiles differ).
The same-dtype XLA baseline runs its float32 matmuls at "highest" precision, as in attention_testing.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_testing as at
import jax_flash

def random_layout(rng, batch: int, seq: int):
    """(segment ids, positions within the document, used length) per row: 1 to 20 documents of random lengths
    filling a random prefix of the row, then padding, which is a segment of its own (id -1)."""
    ids = np.full((batch, seq), -1, np.int32)
    positions = np.zeros((batch, seq), np.int32)
    used = np.zeros(batch, np.int32)
    for b in range(batch):
        used[b] = rng.integers(1, seq + 1)
        docs = int(rng.integers(1, min(20, used[b]) + 1))
        cuts = np.sort(rng.choice(np.arange(1, used[b]), docs - 1, replace=False)) if docs > 1 else []
        bounds = [0, *cuts, used[b]]
        first_id = int(rng.integers(0, 1000))  # ids need not start at 0 or be contiguous
        for d, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            ids[b, begin:end] = first_id + 3 * d
            positions[b, begin:end] = np.arange(end - begin)
    return ids, positions, used


def numpy_visible(seq_q, seq_k, *, left=-1, right=-1, q_lengths=None, kv_lengths=None, q_ids=None, kv_ids=None,
                  q_pos=None, kv_pos=None, batch):
    """[batch, seq_q, seq_k] bool from the documented rule, written with numpy broadcasting."""
    i = np.arange(seq_q)[None, :, None] if q_pos is None else np.asarray(q_pos, np.int64)[:, :, None]
    j = np.arange(seq_k)[None, None, :] if kv_pos is None else np.asarray(kv_pos, np.int64)[:, None, :]
    visible = np.ones((batch, seq_q, seq_k), bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if q_lengths is not None:
        visible &= np.arange(seq_q)[None, :, None] < np.asarray(q_lengths)[:, None, None]
    if kv_lengths is not None:
        visible &= np.arange(seq_k)[None, None, :] < np.asarray(kv_lengths)[:, None, None]
    if q_ids is not None:
        visible &= np.asarray(q_ids)[:, :, None] == np.asarray(kv_ids)[:, None, :]
    return visible


class Case(NamedTuple):
    seq_q: int
    seq_k: int
    dtype: str = "float32"
    heads: tuple[int, int] = (2, 1)
    segments: bool = True
    positions: bool = False
    lengths: str = ""  # "" none, "q", "kv" or "both"
    is_causal: bool = False
    window: int | tuple[int, int] | None = None
    softcap: float | None = None
    batch: int = 2
    head_dim: int = 32

    def id(self) -> str:
        parts = [f"q{self.seq_q}k{self.seq_k}", self.dtype, f"h{self.heads[0]}/{self.heads[1]}"]
        parts += [name for name, on in (("seg", self.segments), ("pos", self.positions),
                                        ("causal", self.is_causal)) if on]
        if self.lengths:
            parts.append(f"len-{self.lengths}")
        if self.window is not None:
            parts.append(f"win{self.window}".replace(" ", ""))
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.head_dim != 32:
            parts.append(f"d{self.head_dim}")
        return "-".join(parts)


CASES = [
    # Packed self-attention.
    Case(300, 300),
    Case(300, 300, is_causal=True),
    Case(300, 300, "bfloat16", heads=(4, 2), is_causal=True, softcap=20.0),
    Case(200, 200, "float16", heads=(4, 1), window=(24, 8)),
    # Padding given as lengths too, and positions within each document for causal / window masks.
    Case(300, 300, lengths="both", is_causal=True),
    Case(300, 300, positions=True, is_causal=True),
    Case(300, 300, "bfloat16", heads=(4, 2), positions=True, lengths="both", window=(40, 0), softcap=5.0),
    Case(200, 200, positions=True, window=7),
    # Query and key/value layouts of different lengths (segment id and position pairs).
    Case(150, 330, is_causal=True, positions=True),
    Case(330, 150, "bfloat16", heads=(2, 2), lengths="kv", window=(30, 30)),
    # Lengths alone, as in jax.nn, with Sq != Sk.
    Case(150, 330, segments=False, lengths="both"),
    Case(330, 150, segments=False, lengths="q", is_causal=True),
    Case(150, 330, "bfloat16", heads=(4, 2), segments=False, lengths="kv", window=(50, 10), batch=3),
    Case(300, 300, "float16", segments=False, lengths="both", is_causal=True, softcap=10.0),
    # The same in bfloat16 (the GPU's tensor-core kernels; float32 runs elsewhere), GQA, a row of length 0.
    Case(330, 150, "bfloat16", heads=(4, 2), segments=False, lengths="q", is_causal=True),
    Case(300, 300, "bfloat16", heads=(4, 1), segments=False, lengths="both", is_causal=True, batch=3),
]


def _case_arguments(case: Case, rng):
    """(jax_flash keyword arguments, numpy visibility mask) of a case."""
    layout_q = random_layout(rng, case.batch, case.seq_q)
    layout_k = layout_q if case.seq_q == case.seq_k else random_layout(rng, case.batch, case.seq_k)
    kwargs, numpy_kwargs = {}, {}
    if case.segments:
        kwargs["segment_ids"] = layout_q[0] if layout_k is layout_q else (layout_q[0], layout_k[0])
        numpy_kwargs.update(q_ids=layout_q[0], kv_ids=layout_k[0])
    if case.positions:
        kwargs["segment_positions"] = layout_q[1] if layout_k is layout_q else (layout_q[1], layout_k[1])
        numpy_kwargs.update(q_pos=layout_q[1], kv_pos=layout_k[1])
    # Lengths at the layout's padding, with some rows empty (0) and some past the sequence (jax.nn clips nothing).
    if case.lengths in ("q", "both"):
        q_lengths = layout_q[2].copy()
        q_lengths[0] = 0 if case.lengths == "q" else q_lengths[0]
        kwargs["query_seq_lengths"] = numpy_kwargs["q_lengths"] = q_lengths
    if case.lengths in ("kv", "both"):
        kv_lengths = layout_k[2].copy()
        kv_lengths[-1] = case.seq_k + 5 if case.lengths == "kv" else 0
        kwargs["key_value_seq_lengths"] = numpy_kwargs["kv_lengths"] = kv_lengths
    left, right = at.window_bounds(case.is_causal, case.window)
    visible = numpy_visible(case.seq_q, case.seq_k, left=left, right=right, batch=case.batch, **numpy_kwargs)
    kwargs.update(is_causal=case.is_causal, local_window_size=case.window, softcap=case.softcap)
    return kwargs, visible


def _vjp(attention):
    def f(q, k, v, cotangent):
        out, vjp = jax.vjp(attention, q, k, v)
        return out, vjp(cotangent)

    return f


def check_case(case: Case, platform, rng):
    dtype = at.DTYPES[case.dtype]
    q, k, v = at.random_qkv(rng, platform, seq_q=case.seq_q, seq_k=case.seq_k, heads_q=case.heads[0],
                            heads_kv=case.heads[1], head_dim=case.head_dim, dtype=dtype, batch=case.batch)
    cotangent = at.normal(rng, q.shape, dtype, platform)
    kwargs, visible = _case_arguments(case, rng)
    flash = _vjp(functools.partial(jax_flash.dot_product_attention, **kwargs))
    got = at.run_flash_checked(flash, (q, k, v, cotangent), platform, ops=("fwd", "bwd"))
    with jax.default_matmul_precision("highest"):
        xla = jax.jit(_vjp(functools.partial(jax_flash.dot_product_attention, implementation="xla", **kwargs)))(
            q, k, v, cotangent)
    ref = at.numpy_attention(*(np.asarray(x).astype(np.float64) for x in (q, k, v, cotangent)),
                             softcap=case.softcap, visible=visible)
    at.assert_trees_rule(got, xla, ref)

    # Rows that see no key: output and query gradient exactly 0; keys no query sees: key/value gradients exactly 0.
    out, dq, dk, dv = (np.asarray(x, np.float64) for x in (got[0], *got[1]))
    blind_rows, unseen_keys = ~visible.any(axis=2), ~visible.any(axis=1)
    assert np.all(out[blind_rows] == 0) and np.all(dq[blind_rows] == 0)
    assert np.all(dk[unseen_keys] == 0) and np.all(dv[unseen_keys] == 0)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in CASES])
def test_forward_and_gradients(case, platform, rng):
    check_case(case, platform, rng)


@pytest.mark.parametrize("seq", [700, 2200])
def test_long_packed_rows(platform, rng, seq):
    """Long rows under causal masking on positions: most blocks are skipped, the rest must agree. 2200 tokens are
    more than 32 tiles of 64, so the CUDA tensor-core kernels classify the tiles they walk in several windows."""
    check_case(Case(seq, seq, "bfloat16", heads=(2, 1), positions=True, lengths="both", is_causal=True,
                    batch=1), platform, rng)


def test_matches_jax_nn_lengths(platform, rng):
    """Where every query row sees a key, lengths give jax.nn.dot_product_attention's result (its masked rows are 0
    as well)."""
    q, k, v = at.random_qkv(rng, platform, seq_q=130, seq_k=170, heads_q=4, heads_kv=2, head_dim=32,
                            dtype=jnp.float32)
    lengths = dict(query_seq_lengths=jnp.array([100, 130], jnp.int32),
                   key_value_seq_lengths=jnp.array([170, 1], jnp.int32))
    with jax.default_matmul_precision("highest"):
        expected = jax.nn.dot_product_attention(q, k, v, is_causal=True, **lengths)
    flash = functools.partial(jax_flash.dot_product_attention, is_causal=True, **lengths)
    got = jax.jit(flash)(q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=2e-5)


def test_vmap_jit_and_unbatched(platform, rng):
    """vmap over an extra axis (segment ids and lengths mapped with it, K/V not) and 3-D inputs agree with the
    batched call, forward and gradients."""
    seq, vmapped = 200, 3
    q = at.normal(rng, (vmapped, 2, seq, 2, 32), jnp.float32, platform)
    k, v = (at.normal(rng, (2, seq, 1, 32), jnp.float32, platform) for _ in range(2))
    ids = np.stack([random_layout(rng, 2, seq)[0] for _ in range(vmapped)])
    lengths = rng.integers(0, seq + 1, (vmapped, 2)).astype(np.int32)

    def loss(q, k, v, ids, lengths):
        out = jax_flash.dot_product_attention(q, k, v, is_causal=True, segment_ids=ids, query_seq_lengths=lengths)
        return jnp.sum(out ** 2), out

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    mapped = jax.jit(jax.vmap(grad, in_axes=(0, None, None, 0, 0)))
    (_, out), (dq, dk, dv) = mapped(q, k, v, ids, lengths)
    for n in range(vmapped):
        (_, out_n), (dq_n, dk_n, dv_n) = jax.jit(grad)(q[n], k, v, ids[n], lengths[n])
        np.testing.assert_allclose(np.asarray(out[n]), np.asarray(out_n), atol=1e-6)
        np.testing.assert_allclose(np.asarray(dq[n]), np.asarray(dq_n), atol=1e-5)
        np.testing.assert_allclose(np.asarray(dk[n]), np.asarray(dk_n), atol=1e-5)
        np.testing.assert_allclose(np.asarray(dv[n]), np.asarray(dv_n), atol=1e-5)
    # Without a batch axis: segment ids [seq], lengths [1] (jax.nn's convention).
    single = jax.jit(lambda q, k, v, ids, lengths: loss(q, k, v, ids, lengths)[1])
    unbatched = single(q[0, 1], k[1], v[1], ids[0, 1], lengths[0, 1:])
    np.testing.assert_allclose(np.asarray(unbatched), np.asarray(out[0, 1]), atol=1e-6)


def test_lowering_passes_the_given_operands(platform, rng):
    """Given operands go to the one FFI target in TOKEN_INPUTS' order, the others as zero-size placeholders, and
    mask_inputs names them (kv lengths 2 + query segment ids 4 + key/value segment ids 8)."""
    q = at.normal(rng, (2, 5, 4, 16), jnp.float32, platform)
    k = at.normal(rng, (2, 7, 2, 16), jnp.float32, platform)
    kwargs = dict(segment_ids=(np.zeros((2, 5), np.int32), np.zeros((2, 7), np.int32)),
                  key_value_seq_lengths=np.array([7, 3], np.int32))
    flash = functools.partial(jax_flash.dot_product_attention, **kwargs)
    text = jax.jit(flash).lower(q, k, k).as_text()
    assert ("tensor<2x7x2x16xf32>, tensor<0xi32>, tensor<2xi32>, tensor<2x5xi32>, tensor<2x7xi32>, tensor<0xi32>, "
            "tensor<0xi32>) -> (tensor<2x5x4x16xf32>, tensor<2x4x5xf32>)") in text
    assert re.search(r"mask_inputs = 14 : i64", text), text


# name: (keyword arguments built from (batch=2, seq_q=5, seq_k=7), exception, message regex)
ERROR_CASES = {
    "lengths_int64": (dict(query_seq_lengths=np.array([5, 3], np.int64)), TypeError,
                      r"query_seq_lengths must have dtype int32, got int64"),
    "lengths_float": (dict(key_value_seq_lengths=np.array([5.0, 3.0], np.float32)), TypeError,
                      r"key_value_seq_lengths must have dtype int32"),
    "lengths_shape": (dict(key_value_seq_lengths=np.array([[5, 3]], np.int32)), ValueError,
                      r"key_value_seq_lengths must have shape \[batch\] = \[2\], got \(1, 2\)"),
    "lengths_batch": (dict(query_seq_lengths=np.array([5, 3, 1], np.int32)), ValueError,
                      r"query_seq_lengths must have shape \[batch\] = \[2\]"),
    "segments_single_needs_equal_seqs": (dict(segment_ids=np.zeros((2, 5), np.int32)), ValueError,
                                         r"a single segment_ids array needs seq_q == seq_k"),
    "segments_query_shape": (dict(segment_ids=(np.zeros((2, 6), np.int32), np.zeros((2, 7), np.int32))),
                             ValueError, r"segment_ids\[0\] \(query\) must have shape \[batch, seq\] = \[2, 5\]"),
    "segments_kv_dtype": (dict(segment_ids=(np.zeros((2, 5), np.int32), np.zeros((2, 7), np.uint8))), TypeError,
                          r"segment_ids\[1\] \(key/value\) must have dtype int32"),
    "segments_triple": (dict(segment_ids=(np.zeros((2, 5), np.int32),) * 3), ValueError,
                        r"segment_ids must be one array or a \(query, key_value\) tuple"),
    "positions_kv_shape": (dict(segment_positions=(np.zeros((2, 5), np.int32), np.zeros((7,), np.int32))),
                           ValueError, r"segment_positions\[1\] \(key/value\) must have shape"),
    "positions_float": (dict(segment_positions=(np.zeros((2, 5), np.float32), np.zeros((2, 7), np.int32))),
                        TypeError, r"segment_positions\[0\] \(query\) must have dtype int32"),
    "mask_still_refused": (dict(mask=np.ones((2, 4, 5, 7), bool)), NotImplementedError,
                           r"does not accept mask"),
}


@pytest.mark.parametrize("implementation", [None, "xla"])
@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_argument_errors(platform, rng, name, implementation):
    kwargs, exception, message = ERROR_CASES[name]
    q = at.normal(rng, (2, 5, 4, 16), jnp.float32, platform)
    k, v = (at.normal(rng, (2, 7, 2, 16), jnp.float32, platform) for _ in range(2))
    with pytest.raises(exception, match=message):
        jax.jit(functools.partial(jax_flash.dot_product_attention, implementation=implementation, **kwargs)).lower(
            q, k, v)


def test_unbatched_lengths_follow_jax_nn(platform, rng):
    q = at.normal(rng, (5, 4, 16), jnp.float32, platform)
    with pytest.raises(ValueError, match=r"query_seq_lengths must have shape \[batch\] = \[1\] \(inputs without a "
                                         r"batch axis count as batch 1, as in jax.nn\), got \(\)"):
        jax_flash.dot_product_attention(q, q, q, query_seq_lengths=np.int32(3))
