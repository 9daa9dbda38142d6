"""Shared pytest configuration of the jax_flash suite.

* float64 is enabled so the references can be computed in double precision;
* every test that takes a ``platform`` argument runs once per platform among ("cpu", "gpu") that both has a JAX
  device here and has kernels in this build of jax_flash (``jax_flash._ffi.compiled_platforms()``, where JAX's "gpu"
  is jax_flash's "cuda"). GPU-only tests take ``gpu_platform`` instead, which skips cleanly on machines without one;
* ``rng`` is a numpy Generator seeded from the test's node id, so every case draws its own data, reproducibly.

Run from outside the source tree (e.g. ``cd /tmp && python -m pytest /work/main/tests -n 2``) so that the installed
package, with its compiled extension, is the one imported.
"""

from __future__ import annotations

import importlib.metadata
import os
import zlib


def _cuda_plugin_installed() -> bool:
    return any("cuda" in (d.metadata["Name"] or "").lower() and "jax" in (d.metadata["Name"] or "").lower()
               for d in importlib.metadata.distributions())


# The XLA baselines and references are many small programs that XLA:CPU compiles far more slowly (~3x) than it runs
# them; LLVM optimisation level 0 keeps the suite inside CI's time limit. It only touches XLA-compiled code (never
# jax_flash's precompiled kernels) and leaves HLO-level rewrites alone, so the baselines' numerics stay those of XLA.
# Not applied where a CUDA plugin is installed (the flag is backend-wide) or when XLA_FLAGS already sets a level.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "") and not _cuda_plugin_installed():
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

# Under pytest-xdist several processes share one GPU; JAX's default preallocation (75% of its memory per process)
# would make all but the first fail with out-of-memory errors (15 workers on an H200 did). Allocate on demand
# instead, unless the caller chose otherwise.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)

try:
    from jax_flash import _ffi  # noqa: E402  (after the x64 switch, before any array is made)
except ImportError as error:  # typically the source folder shadowing the installed package
    raise ImportError(
        f"cannot import jax_flash's compiled extension ({error}); install the package (pip install "
        f"--no-build-isolation .) and run pytest from outside the source tree, e.g. "
        f"'cd /tmp && python -m pytest /path/to/jax_flash/tests'") from error

# JAX platform name -> jax_flash's lowering platform name.
_KERNEL_PLATFORM = {"cpu": "cpu", "gpu": "cuda"}


def _has_devices(platform: str) -> bool:
    try:
        return len(jax.devices(platform)) > 0
    except RuntimeError:  # the backend is not installed / initialised on this machine
        return False


def _available_platforms() -> list[str]:
    compiled = _ffi.compiled_platforms()
    return [p for p in ("cpu", "gpu") if _has_devices(p) and _KERNEL_PLATFORM[p] in compiled]


PLATFORMS = _available_platforms()
HAS_GPU = _has_devices("gpu")
GPU_KERNELS = "gpu" in PLATFORMS


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long sequences (1000); still run by default, deselect with -m 'not slow'")
    config.addinivalue_line("markers", "gpu: needs a GPU with jax_flash's CUDA kernels; skipped elsewhere")


def pytest_report_header(config):
    return [f"jax_flash platforms under test: {PLATFORMS} (compiled kernels: {_ffi.compiled_platforms()})"]


def pytest_generate_tests(metafunc):
    if "platform" in metafunc.fixturenames:
        if not PLATFORMS:
            metafunc.parametrize("platform", [pytest.param("none", marks=pytest.mark.skip(
                reason="no platform with both a JAX device and compiled jax_flash kernels"))])
        else:
            metafunc.parametrize("platform", PLATFORMS)


@pytest.fixture
def gpu_platform():
    if not HAS_GPU:
        pytest.skip("no GPU on this machine")
    if not GPU_KERNELS:
        pytest.skip("jax_flash was built without CUDA kernels")
    return "gpu"


@pytest.fixture
def rng(request):
    """A Generator seeded from the node id (parametrization included): fresh, distinct data per case."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
