"""shard_map (per-shard keys) and plain jit with sharded operands, on two CPU devices.

Runs in a subprocess: the host device count must be set before jax starts.
"""

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_autotune as jat
    from jax_autotune.warmup import matmul_problems

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    per_shard = jax.jit(shard_map(lambda a, b: jat.matmul(a, b), mesh=mesh,
                                  in_specs=(P("x"), P()), out_specs=P("x")))
    reference = jax.jit(shard_map(lambda a, b: jnp.matmul(a, b, precision="highest"), mesh=mesh,
                                  in_specs=(P("x"), P()), out_specs=P("x")))
    loss = lambda f: lambda a, b: jnp.sum(f(a, b) ** 2)
    grad_w = jax.grad(loss(per_shard), argnums=1)(xs, w)
    grad_ref = jax.grad(loss(reference), argnums=1)(xs, w)
    exact = x.astype(np.float64) @ w
    print(json.dumps({
        "shard_map_error": float(np.abs(per_shard(xs, w) - exact).max()),
        "plain_jit_error": float(np.abs(jax.jit(jat.matmul)(xs, w) - exact).max()),
        "grad_error": float(np.abs(grad_w - grad_ref).max() / np.abs(grad_ref).max()),
        "shard_m": [p.m for p, _ in matmul_problems(jax.make_jaxpr(per_shard)(xs, w))],
    }))
""")


def test_shard_map_tunes_per_shard_shapes_and_plain_jit_with_sharded_operands_is_correct(tmp_path):
    env = dict(os.environ, JAX_AUTOTUNE_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shard_m"] == [32]  # 64 rows over 2 shards
    assert result["shard_map_error"] < 1e-4
    assert result["plain_jit_error"] < 1e-4
    assert result["grad_error"] < 1e-5  # the replicated operand's cotangent is summed over shards
