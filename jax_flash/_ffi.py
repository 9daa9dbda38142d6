"""The one place that loads the compiled extension and registers its FFI targets with XLA."""

from __future__ import annotations

import os

import jax

from jax_flash import _jax_flash_ext as _ext

# JAX_FLASH_KERNELS=sm80 keeps an sm_90 GPU on the sm80 tensor-core kernels; sm86 also holds every GPU to the 99 KB
# of shared memory per block of sm86/sm89 GPUs, and so to their tiles and decode plans (csrc/cuda/kernel_choice.h
# reads it). Checked here because the kernels cannot raise, and a misspelt value would otherwise be silently ignored.
KERNEL_CHOICES = ("auto", "sm80", "sm86")
if os.environ.get("JAX_FLASH_KERNELS", "auto") not in KERNEL_CHOICES:
    raise ValueError(f"JAX_FLASH_KERNELS={os.environ['JAX_FLASH_KERNELS']!r}: allowed values are {KERNEL_CHOICES}")

# XLA's platform names for registration, keyed by jax_flash's lowering platform names.
_XLA_PLATFORM = {"cpu": "cpu", "cuda": "CUDA"}
_HANDLERS = {"cpu": _ext.cpu_handlers(), "cuda": _ext.cuda_handlers()}

for _platform, _targets in _HANDLERS.items():
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=_XLA_PLATFORM[_platform])


def compiled_platforms() -> tuple[str, ...]:
    """Platforms ("cpu", "cuda") this build has kernels for."""
    return tuple(p for p, targets in _HANDLERS.items() if targets)


def cuda_architectures() -> str:
    """The CMAKE_CUDA_ARCHITECTURES this build was compiled for ('' without CUDA)."""
    return _ext.cuda_architectures


def hopper_kernels() -> bool:
    """Whether this build holds the sm_90a (wgmma/TMA) kernels, which Hopper GPUs use for fp16/bf16."""
    return bool(_ext.hopper_kernels)


def fp8_kernels() -> bool:
    """Whether this build holds the Hopper FP8 forward (sm_90a and the fp8 dtype among JAX_FLASH_DTYPES)."""
    return bool(_ext.fp8_kernels)


def kernel_choice() -> str:
    """JAX_FLASH_KERNELS as checked at import: "auto"; "sm80" to keep Hopper GPUs on the sm80 kernels; "sm86" for
    the sm80 kernels with the tiles of GPUs whose blocks may use 99 KB of shared memory (sm86, sm89)."""
    return os.environ.get("JAX_FLASH_KERNELS", "auto")


def target_name(op: str, platform: str) -> str:
    """FFI target of `op` ("attention_fwd", "attention_bwd", "attention_fp8_fwd") on `platform`:
    jax_flash_<op>_<platform>."""
    return f"jax_flash_{op}_{platform}"
