"""Imports flax for the layers only, so that jax_flash (and jax_flash.flax.attention_fn) work without it."""

from __future__ import annotations

import importlib


def import_flax(module_name: str):
    """importlib.import_module(module_name), with the install command in the error when flax is missing."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "flax":  # flax is there but lacks a dependency: that error says more
            raise
        raise ModuleNotFoundError(f"jax_flash's Flax layers need flax, which is not installed: pip install "
                                  f"'jax_flash[flax]' (or pip install flax)", name="flax") from error
