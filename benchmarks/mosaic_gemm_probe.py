"""Our Mosaic GPU GEMM (``kernels/gpu/mosaic_gemm.py``) against XLA's dot, bare, on an H200.

    python benchmarks/mosaic_gemm_probe.py benchmarks     # one JSON line a shape

For each shape (bf16), every config ``configs_for`` proposes: its relative error against
XLA's dot and the device time of both (CUPTI, ``peers.interleaved_device_us``); a config
``supports`` refuses is reported with its reason.
"""
import json
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, sys.argv[1])
import peers
from jax_autotune.kernels.gpu import mosaic_gemm as mg
for m, n, k, tb in [(4096, 4096, 4096, False), (8192, 14336, 4096, False), (2048, 50264, 768, True), (2048, 50264, 768, False), (1000, 1032, 1008, False), (16, 8192, 8192, False)]:
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, k) if tb else (k, n), jnp.bfloat16)
    xla = jax.jit(lambda a, b: (a @ (b.T if tb else b)))
    ref = xla(a, b).astype(jnp.float32)
    row, fns, names = {"shape": [m, n, k, tb]}, [xla], ["xla"]
    for c in mg.configs_for(m, n, k, "bfloat16"):
        f = jax.jit(lambda a, b, c=c: mg.mosaic_gemm(a, b, config=c, transpose_rhs=tb))
        try:
            out = f(a, b).astype(jnp.float32)
            row[c.name + "_err"] = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
            fns.append(f); names.append(c.name)
        except Exception as e:
            row[c.name + "_error"] = str(e)[:300]
    for nm, us in zip(names, peers.interleaved_device_us(fns, (a, b))):
        row[nm + "_us"] = round(us, 1)
    print(json.dumps(row), flush=True)
