"""Lowering for CUDA on a machine without a GPU: the module's text, and its custom calls.

    >>> custom_calls(cuda_text(jax.jit(kernel), lhs_spec, rhs_spec))
    ['mosaic_gpu_v2']
"""

import re
import warnings


def cuda_text(jitted, *avals) -> str:
    """``jitted`` traced for ``avals`` and lowered for CUDA (a DeprecationWarning is an error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return jitted.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text: str) -> list[str]:
    return re.findall(r"custom_call @(\w+)", text)
