"""What an installed jax_flash (a wheel, or pip install .) reports about itself: build_info() and
`python -m jax_flash.info` agree with the build, and a CPU-only build says so instead of failing."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import jax

import jax_flash


def test_build_info_describes_this_build():
    info = jax_flash.build_info()
    # pyproject.toml and jax_flash/__init__.py both hold the version; a release bumps both.
    assert info["jax_flash"] == jax_flash.__version__ == metadata.version("jax_flash")
    assert info["jax"] == jax.__version__
    assert "cpu" in info["compiled_platforms"]
    has_cuda = "cuda" in info["compiled_platforms"]
    assert bool(info["cuda_architectures"]) == has_cuda
    # The sm_90a kernels are built exactly when the architectures include sm_90a.
    assert info["hopper_kernels"] == ("90a" in info["cuda_architectures"])
    # The FP8 forward is a Hopper kernel (built by default, unless JAX_FLASH_DTYPES leaves fp8 out).
    assert info["hopper_kernels"] or not info["fp8_kernels"]
    if jax.default_backend() != "gpu":
        expected = "none visible to jax" if has_cuda else "none: CPU-only build"
        assert info["gpu"].startswith(expected)
    else:
        assert info["gpu"].startswith(jax.devices()[0].device_kind)
        assert has_cuda or "this build has no CUDA kernels" in info["gpu"]
        if has_cuda:
            hopper = getattr(jax.devices()[0], "compute_capability", None) == "9.0" and info["hopper_kernels"]
            assert ("the Hopper kernels" in info["gpu"]) == (hopper and jax_flash._ffi.kernel_choice() == "auto")


def test_info_module_prints_every_field(tmp_path):
    # From tmp_path: in the source folder, python -m would import the uncompiled package.
    result = subprocess.run([sys.executable, "-m", "jax_flash.info"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, check=True)
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert list(fields) == list(jax_flash.build_info())
    assert all(fields.values())  # empty values (no CUDA architectures) print as "none"
