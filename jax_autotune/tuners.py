"""The earlier name of ``jax_autotune.registry``: importing it gives that very module.

    >>> import jax_autotune.registry, jax_autotune.registry
    >>> jax_autotune.registry is jax_autotune.registry
    True
"""

import sys

from jax_autotune import registry

sys.modules[__name__] = registry
