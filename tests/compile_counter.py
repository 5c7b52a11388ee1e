"""Runs a script and prints, last, one JSON line with the XLA compiles it ran.

    python tests/compile_counter.py SCRIPT [ARGS...]

A compile that JAX's persistent cache serves is a request and a hit; a real compile is a
request without a hit (``jax_autotune.tuning.compile_cache.CompileCounter``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from jax_autotune.tuning.compile_cache import CompileCounter

if __name__ == "__main__":
    counter = CompileCounter()
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")
    print(json.dumps({"compile_counter": counter.to_json()}))
