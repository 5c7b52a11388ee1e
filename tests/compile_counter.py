"""Counts the XLA compiles a process really runs, with the persistent cache in use.

    python tests/compile_counter.py SCRIPT [ARGS...]   # runs SCRIPT, then prints one JSON line

A compile that JAX's persistent cache serves is a request and a hit; a real compile is a
request without a hit. Imported by tests too (``CompileCounter``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import jax


class CompileCounter:
    """``requests``, ``hits`` and ``compiles`` (requests - hits) since it was made."""

    REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
    HIT = "/jax/compilation_cache/cache_hits"

    def __init__(self):
        self.requests = self.hits = 0
        jax.monitoring.register_event_listener(self._count)

    def _count(self, event, **_):
        if event == self.REQUEST:
            self.requests += 1
        elif event == self.HIT:
            self.hits += 1

    @property
    def compiles(self) -> int:
        return self.requests - self.hits

    def to_json(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "compiles": self.compiles}


if __name__ == "__main__":
    counter = CompileCounter()
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")
    print(json.dumps({"compile_counter": counter.to_json()}))
