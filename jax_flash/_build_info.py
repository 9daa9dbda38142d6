"""What this build of jax_flash contains and which device it would use."""

from __future__ import annotations

from importlib import metadata

import jax

from jax_flash import _ffi


def build_info() -> dict:
    return {
        "jax_flash": metadata.version("jax_flash"),
        "jax": jax.__version__,
        "compiled_platforms": list(_ffi.compiled_platforms()),
        "cuda_architectures": _ffi.cuda_architectures(),
        "default_device": str(jax.devices()[0]),
    }

