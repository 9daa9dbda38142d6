"""`python -m jax_flash.info`: print jax_flash.build_info()."""

from jax_flash._build_info import build_info

for key, value in build_info().items():
    if isinstance(value, bool):
        value = "yes" if value else "no"
    print(f"{key}: {value or 'none'}")  # a CPU-only build has no CUDA architectures: say so rather than print nothing
