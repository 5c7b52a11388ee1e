"""jax_autotune: a matmul autotuner for JAX."""

from jax_autotune import config
from jax_autotune.key import Kind, Layout, Level, MatmulKey, MatmulProblem, Precision, Scale, key_for

__version__ = "0.1.0"

__all__ = [
    "Kind", "Layout", "Level", "MatmulKey", "MatmulProblem", "Precision", "Scale",
    "config", "key_for", "__version__",
]
