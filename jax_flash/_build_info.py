"""What this build of jax_flash contains and which device it would use."""

from __future__ import annotations

from importlib import metadata

import jax

from jax_flash import _ffi


def build_info() -> dict:
    """Versions, compiled platforms, CUDA architectures ('' in a CPU-only build), the default device, and a line on
    the GPU that jax_flash would run on (or why it runs on the CPU)."""
    return {
        "jax_flash": metadata.version("jax_flash"),
        "jax": jax.__version__,
        "jaxlib": metadata.version("jaxlib"),
        "compiled_platforms": list(_ffi.compiled_platforms()),
        "cuda_architectures": _ffi.cuda_architectures(),
        "hopper_kernels": _ffi.hopper_kernels(),
        "fp8_kernels": _ffi.fp8_kernels(),
        "default_device": str(jax.devices()[0]),
        "gpu": _gpu_line(),
    }


def _gpu_line() -> str:
    built = "cuda" in _ffi.compiled_platforms()
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        if built:
            return "none visible to jax (is jax's CUDA plugin installed, e.g. jax[cuda13]?); kernels run on the CPU"
        return "none: CPU-only build (JAX_FLASH_CUDA=OFF or no nvcc at build time); kernels run on the CPU"
    device = gpus[0]
    capability = getattr(device, "compute_capability", None)
    name = f"{device.device_kind} ({device}{f', compute capability {capability}' if capability else ''})"
    if not built:
        return f"{name} is visible, but this build has no CUDA kernels: rebuild with nvcc on PATH"
    return f"{name}, {len(gpus)} visible; fp16/bf16 on {_kernel_family(capability)}"


def _kernel_family(capability) -> str:
    """The kernels launch.cu picks for fp16/bf16 on a GPU of this compute capability (a string like "9.0")."""
    if _ffi.kernel_choice() == "sm86":
        return "the sm80 tensor-core kernels, tiles for 99 KB of shared memory per block (JAX_FLASH_KERNELS=sm86)"
    if str(capability) != "9.0":
        return "the sm80 tensor-core kernels"
    if not _ffi.hopper_kernels():
        return "the sm80 tensor-core kernels (this build has no sm_90a kernels)"
    if _ffi.kernel_choice() == "sm80":
        return "the sm80 tensor-core kernels (JAX_FLASH_KERNELS=sm80)"
    return "the Hopper kernels (wgmma, TMA; a head dim whose Hopper bucket this build left out runs on sm80)"
