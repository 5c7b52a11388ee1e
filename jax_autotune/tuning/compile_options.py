"""How the tuner compiles the programs it runs: XLA's options for them, in one place.

The tuner's programs (candidates, correctness checks, XLA priming, timing loops) are
compiled without command buffers (CUDA graphs), an option XLA:GPU reads and the other
platforms ignore, so that tuning never touches the CUDA graphs of the user's programs:

* every compile that builds a command buffer evicts (destroys) the CUDA graphs of every
  other executable of the process; a tuned training process was seen to die by SIGSEGV
  in that eviction (``CommandBufferThunk::EvictCommandBuffers`` under ``PjRtCompile``), and
  the tuner compiles on threads beside its timing;
* the tuner times kernels with JAX's CUPTI profiler, while XLA itself never runs CUDA
  graphs under a profiler it knows of (its command-buffer thunk runs them op by op then).

Without command buffers the tuner's compiles evict nothing (``benchmarks/command_buffer_stress.py``
counts the evictions), and ``DeviceTimer.release`` detaches CUPTI after each key, so that
no graph of the user's runs or is destroyed under it. The user's programs keep XLA's defaults.

    >>> compiled = compile_lowered(jax.jit(f).lower(x))
    >>> compiled = compile_lowered(lowered, {"xla_gpu_require_complete_aot_autotune_results": True})
"""

from __future__ import annotations

# xla_gpu_enable_command_buffer lists the kinds of commands XLA may put in CUDA graphs:
# none at all
TUNER_COMPILER_OPTIONS = {"xla_gpu_enable_command_buffer": ""}


def compile_lowered(lowered, options: dict | None = None):
    """``lowered.compile()`` with the tuner's options (and ``options`` on top)."""
    return lowered.compile(compiler_options={**TUNER_COMPILER_OPTIONS, **(options or {})})


__all__ = ["TUNER_COMPILER_OPTIONS", "compile_lowered"]
