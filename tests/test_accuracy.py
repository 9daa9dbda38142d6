"""Forward outputs and gradients of jax_flash against the float64 reference, across shapes, masks and dtypes.

Every case checks out, dq, dk and dv (gradients of sum(out * cotangent) with a random cotangent) under the tolerance
rule of attention_testing: max-abs error vs the float64 reference <= 2 * (XLA's error in the same dtype)
+ 4 * eps(dtype) * max(max|reference|, 1). The reference here is the independent float64 numpy implementation
(attention_testing.numpy_attention, itself checked in test_reference.py), which needs no XLA compilation. The jitted
function is also checked to lower to jax_flash's fwd and bwd kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

import attention_testing as at


class Case(NamedTuple):
    seq_q: int
    seq_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    is_causal: bool = False
    window: int | tuple[int, int] | None = None
    softcap: float | None = None
    batch: int = 2
    scale: float | None = None

    def id(self) -> str:
        parts = [f"q{self.seq_q}k{self.seq_k}", f"h{self.heads_q}/{self.heads_kv}", f"d{self.head_dim}", self.dtype]
        if self.is_causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"win{self.window}".replace(" ", ""))
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        if self.batch != 2:
            parts.append(f"b{self.batch}")
        return "-".join(parts)


def _cases():
    cases = []
    # Head dims x dtypes. Causal and GQA vary along the sweep.
    for i, head_dim in enumerate((32, 40, 64, 80, 96, 128, 160, 192, 256)):
        for j, dtype in enumerate(("float32", "bfloat16", "float16")):
            seq_q, seq_k = ((113, 113), (17, 113), (113, 17))[(i + j) % 3]
            cases.append(Case(seq_q, seq_k, 2, (2, 1)[(i + j) % 2], head_dim, dtype, is_causal=bool((i + j) % 2),
                              batch=1))
    # Sequence lengths, including 1 and Sq != Sk both ways, causal on and off.
    for seq_q, seq_k in ((1, 1), (1, 17), (17, 1), (17, 17), (17, 113), (113, 17), (113, 113)):
        for is_causal in (False, True):
            cases.append(Case(seq_q, seq_k, 4, 2, 64, "float32", is_causal=is_causal))
    for seq_q, seq_k in ((1, 113), (113, 1), (17, 113), (113, 17)):
        cases.append(Case(seq_q, seq_k, 4, 4, 64, "bfloat16", is_causal=True))
    # GQA ratios 1, 2, 8.
    for heads_q, heads_kv in ((8, 8), (8, 4), (8, 1)):
        for is_causal in (False, True):
            cases.append(Case(17, 113, heads_q, heads_kv, 64, "float32", is_causal=is_causal, batch=1))
            cases.append(Case(113, 113, heads_q, heads_kv, 32, "bfloat16", is_causal=is_causal, batch=1))
    # Local windows: symmetric int, one-sided tuples, combined with causal, Sq < Sk and Sq > Sk.
    for window in (5, (3, 0), (0, 7), (16, 2), (40, 40)):
        for is_causal in (False, True):
            cases.append(Case(113, 113, 2, 1, 64, "float32", is_causal=is_causal, window=window))
        cases.append(Case(17, 113, 2, 2, 64, "bfloat16", window=window))
        cases.append(Case(113, 17, 2, 2, 64, "float16", is_causal=True, window=window))
    # Soft-capping, alone and with masks.
    for dtype in ("float32", "bfloat16", "float16"):
        cases.append(Case(113, 113, 4, 2, 64, dtype, softcap=5.0))
        cases.append(Case(17, 113, 4, 1, 128, dtype, is_causal=True, softcap=30.0))
        cases.append(Case(113, 17, 4, 2, 32, dtype, window=(8, 3), softcap=2.0))
    # Rows carried by two or three keys: the backward's dP - delta cancels most of their digits, in float32 too.
    for seq_k, head_dim in ((2, 96), (3, 128), (3, 256)):
        cases.append(Case(64, seq_k, 4, 2, head_dim, "float32", scale=0.5))
    # Head dims that are not multiples of 8 (the CPU kernels take any size up to 256; CUDA ones skip them).
    cases.append(Case(113, 17, 4, 2, 36, "float32", is_causal=True))
    cases.append(Case(17, 113, 2, 1, 20, "bfloat16", window=(9, 9)))
    cases.append(Case(113, 113, 2, 2, 100, "float16", softcap=15.0, batch=1))
    # Explicit scales (large one stresses the softmax, small one flattens it).
    cases.append(Case(113, 113, 2, 1, 64, "float32", is_causal=True, scale=1.0))
    cases.append(Case(17, 113, 2, 1, 64, "float32", scale=0.01))
    cases.append(Case(17, 113, 2, 1, 64, "bfloat16", scale=0.01))
    # A negative scale flips which raw score is a row's largest: masked keys must still get probability 0 and no
    # probability may overflow (the Hopper forward, which takes its maxima before scaling, leaves these to sm80).
    cases.append(Case(113, 113, 2, 1, 64, "float16", is_causal=True, scale=-1.0))
    cases.append(Case(17, 113, 2, 1, 128, "bfloat16", window=(9, 9), scale=-0.3))
    return [pytest.param(c, id=c.id()) for c in cases]


_SLOW_CASES = [
    Case(1000, 1000, 2, 1, 64, "float32", is_causal=True, batch=1),
    Case(113, 1000, 4, 2, 128, "bfloat16", batch=1),
    Case(1000, 113, 2, 2, 64, "float16", window=(64, 0), batch=1),
    Case(1000, 1000, 2, 2, 32, "bfloat16", window=(128, 128), softcap=20.0, batch=1),
    Case(1000, 1000, 8, 1, 64, "float32", is_causal=True, window=(200, 0), batch=1),
    Case(17, 1000, 4, 1, 256, "float16", softcap=10.0, batch=1),
    Case(1000, 1000, 4, 1, 128, "bfloat16", is_causal=True, batch=1),
    Case(1000, 777, 4, 2, 96, "float16", window=(100, 30), softcap=30.0, batch=1),
    Case(777, 1000, 2, 2, 192, "bfloat16", is_causal=True, batch=1),
    Case(1000, 1000, 2, 1, 256, "bfloat16", window=(300, 0), batch=1),
]


def _check_case(case: Case, platform, rng):
    at.skip_if_unsupported(platform, case.head_dim)
    dtype = at.DTYPES[case.dtype]
    q, k, v = at.random_qkv(rng, platform, seq_q=case.seq_q, seq_k=case.seq_k, heads_q=case.heads_q,
                            heads_kv=case.heads_kv, head_dim=case.head_dim, dtype=dtype, batch=case.batch)
    cotangent = at.normal(rng, q.shape, dtype, platform)
    kwargs = dict(is_causal=case.is_causal, local_window_size=case.window, softcap=case.softcap, scale=case.scale)
    out, grads = at.check_fwd_and_vjp(q, k, v, cotangent, platform, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert all(g.dtype == dtype for g in grads)


@pytest.mark.parametrize("case", _cases())
def test_forward_and_gradients(case, platform, rng):
    _check_case(case, platform, rng)


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in _SLOW_CASES])
def test_forward_and_gradients_long(case, platform, rng):
    _check_case(case, platform, rng)


# Lengths from which the Hopper kernels switch forms: the 192-row forward at head dim 64 from 2048 queries
# (hopper/generate_instantiations.py's LONG_QUERIES; 2049 rows leave its last tile with 129) and the backward's fused
# dQ at head dims 65..128. On a GPU only: XLA:CPU's baselines at these lengths would take minutes.
_GPU_LONG_CASES = [
    Case(2049, 2100, 4, 2, 64, "bfloat16", is_causal=True, batch=1),
    Case(2100, 2049, 2, 2, 64, "float16", window=(300, 40), batch=1),
    Case(2049, 2049, 4, 1, 128, "bfloat16", batch=1),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in _GPU_LONG_CASES])
def test_forward_and_gradients_long_rows(case, gpu_platform, rng):
    _check_case(case, gpu_platform, rng)


# Several times more work tiles than an H200 has SMs (132): each CTA of the persistent Hopper forward takes four or
# more in turn, so its query buffers (two at head dims 64 and 128) are handed back and loaded again. Short rows keep
# the float64 reference cheap. On a GPU only.
_GPU_MANY_TILES_CASES = [
    Case(300, 300, 32, 8, 128, "bfloat16", is_causal=True, batch=6),  # 3 query tiles x 32 heads x 6 = 576 work tiles
    Case(257, 400, 24, 24, 64, "float16", batch=8),  # 3 x 24 x 8 = 576
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id()) for c in _GPU_MANY_TILES_CASES])
def test_forward_and_gradients_many_work_tiles(case, gpu_platform, rng):
    _check_case(case, gpu_platform, rng)
