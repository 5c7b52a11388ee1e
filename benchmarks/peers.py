"""The peers a GPU user would pick instead of the tuned matmul, each timed on the device.

* ``torch_kernel_us``: cuBLAS through ``torch.matmul`` (or any torch callable, such as an
  Inductor-compiled one), the summed duration of the kernels one call launches, from
  ``torch.profiler``. A Python loop of torch calls measures dispatch below about 50 us,
  not the kernel, so no host clock is used.
* ``inductor``: ``torch.compile(torch.matmul, mode="max-autotune-no-cudagraphs")``; its
  first call compiles and autotunes (seconds returned), its kernels (pads included) are
  timed like torch's.
* ``xla_exhaustive``: XLA's dot compiled with ``--xla_gpu_exhaustive_tiling_search=true``
  in a child process (the flag is process-wide), CUPTI device time and compile seconds,
  shapes in order until a wall-time budget runs out.

``torch_peers`` runs the torch peers in a child process too: torch.profiler keeps CUPTI
subscribed, and JAX's CUPTI profiler cannot subscribe beside it.

    >>> us = torch_kernel_us(lambda: torch.matmul(a, b))
    >>> rows = xla_exhaustive([("bfloat16", 1, 768, 768, 768, False)], budget_s=120)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ITERATIONS = 20
ROUNDS = 3


def torch_kernel_us(fn, iterations: int = ITERATIONS, rounds: int = ROUNDS) -> float:
    """Median over ``rounds`` of the device time of one call of ``fn`` (all its kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iterations):
                fn()
            torch.cuda.synchronize()
        total = 0.0
        for event in prof.key_averages():
            total += getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
        if total <= 0:
            raise RuntimeError("torch.profiler recorded no CUDA kernel")
        per_call.append(total / iterations)
    return statistics.median(per_call)


def torch_operands(dtype: str, m: int, n: int, k: int, transpose_b: bool = False, batch: int = 1):
    """Row-major operands; a transposed rhs is a (n, k) tensor seen as (k, n)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True  # f32 at DEFAULT is TF32 in XLA too
    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    lead = (batch,) if batch > 1 else ()
    a = torch.randn(*lead, m, k, device="cuda", dtype=tdtype)
    b = (torch.randn(*lead, n, k, device="cuda", dtype=tdtype).transpose(-1, -2) if transpose_b
         else torch.randn(*lead, k, n, device="cuda", dtype=tdtype))
    return a, b


def cublas_us(dtype: str, m: int, n: int, k: int, transpose_b: bool = False, batch: int = 1) -> float:
    import torch
    a, b = torch_operands(dtype, m, n, k, transpose_b, batch)
    return torch_kernel_us(lambda: torch.matmul(a, b))


def inductor(dtype: str, m: int, n: int, k: int, transpose_b: bool = False, batch: int = 1) -> dict:
    """{'us': device time per call, 'tune_s': first call (compile + autotune)}."""
    import torch
    a, b = torch_operands(dtype, m, n, k, transpose_b, batch)
    compiled = torch.compile(torch.matmul, mode="max-autotune-no-cudagraphs", dynamic=False)
    start = time.perf_counter()
    compiled(a, b)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - start
    return {"us": torch_kernel_us(lambda: compiled(a, b)), "tune_s": tune_s}


def _torch_child(cases: list, inductor_budget_s: float) -> None:
    """In the child: per case one JSON line with cuBLAS's and (within the budget, bf16)
    Inductor's kernel time; a peer that fails is reported, not fatal."""
    spent = 0.0
    for dtype, batch, m, n, k, transpose_b in cases:
        row: dict = {"case": [dtype, batch, m, n, k, transpose_b]}
        try:
            row["cublas_us"] = cublas_us(dtype, m, n, k, transpose_b, batch)
        except Exception as err:  # noqa: BLE001
            row["cublas_error"] = f"{type(err).__name__}: {err}"[:200]
        if spent < inductor_budget_s and dtype == "bfloat16":
            started = time.perf_counter()
            try:
                row.update({f"inductor_{key}": value for key, value in
                            inductor(dtype, m, n, k, transpose_b, batch).items()})
            except Exception as err:  # noqa: BLE001
                row["inductor_error"] = f"{type(err).__name__}: {err}"[:200]
            spent += time.perf_counter() - started
        print(json.dumps(row), flush=True)


def torch_peers(cases: list, inductor_budget_s: float, timeout_s: float) -> dict:
    """{case: {'cublas_us', 'inductor_us', 'inductor_tune_s', ...errors}} from a child
    process: torch.profiler keeps CUPTI subscribed, which JAX's own profiler then cannot."""
    return _run_child(["--torch-child", json.dumps(cases), str(inductor_budget_s)], dict(os.environ), timeout_s)


def _run_child(args: list, env: dict, timeout_s: float) -> dict:
    return case_rows_from_child(__file__, args, env, timeout_s)


def case_rows_from_child(script: str, args: list, env: dict, timeout_s: float) -> dict:
    """``{tuple(row["case"]): row}`` of the JSON lines ``python script *args`` prints, those
    printed before a timeout too (the child is then killed)."""
    proc = subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    found = {}
    for line in out.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "case" in row:
            found[tuple(row.pop("case"))] = row
    return found


def interleaved_device_us(fns, args, rounds: int = ROUNDS) -> list[float]:
    """Median CUPTI device time in us of each JAX function, in alternating rounds so that
    clock and temperature drift weigh on all alike."""
    from jax.experimental.mosaic.gpu import profiler
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, samples):
            _, ms = profiler.measure(fn, iterations=ITERATIONS)(*args)
            out.extend(t * 1e3 for t in (ms if isinstance(ms, (list, tuple)) else [ms]))
    return [statistics.median(s) for s in samples]


def _exhaustive_child(cases: list) -> None:
    """In the child: one JSON line per shape as soon as it is measured."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    for dtype, batch, m, n, k, transpose_b in cases:
        lead = (batch,) if batch > 1 else ()
        a = jnp.ones((*lead, m, k), dtype)
        b = jnp.ones((*lead, n, k) if transpose_b else (*lead, k, n), dtype)
        dims = (((a.ndim - 1,), (b.ndim - 1 if transpose_b else b.ndim - 2,)), (tuple(range(len(lead))),) * 2)
        start = time.perf_counter()
        compiled = jax.jit(lambda x, y: lax.dot_general(x, y, dims, preferred_element_type=x.dtype)).lower(a, b).compile()
        compile_s = time.perf_counter() - start
        us, = interleaved_device_us([compiled], (a, b))
        print(json.dumps({"case": [dtype, batch, m, n, k, transpose_b], "compile_s": compile_s,
                          "us": us}), flush=True)


def xla_exhaustive(cases: list, budget_s: float) -> dict:
    """{(dtype, batch, m, n, k, transpose_b): {'us', 'compile_s'}} for the cases that
    finished within the budget."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_exhaustive_tiling_search=true").strip()
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return _run_child(["--exhaustive-child", json.dumps(cases)], env, budget_s)


if __name__ == "__main__" and sys.argv[1:2] == ["--exhaustive-child"]:
    _exhaustive_child(json.loads(sys.argv[2]))
elif __name__ == "__main__" and sys.argv[1:2] == ["--torch-child"]:
    _torch_child(json.loads(sys.argv[2]), float(sys.argv[3]))
