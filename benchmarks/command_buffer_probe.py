"""Do our cuBLASLt custom calls cost a tuned step its CUDA graphs? The same model step,
its cuBLASLt FFI targets registered as XLA registers them today (not command-buffer
compatible: XLA ends a command buffer before each such call and begins another after it)
and registered COMMAND_BUFFER_COMPATIBLE (XLA traces the call into the graph).

    python benchmarks/command_buffer_probe.py --out probe.json [--models decode,gpt2] \
        [--variants layers,autotune] [--steps 30]

Per model: plain once, then each variant twice, traits off then on, in a child process
each and one store per model (the first child tunes, the second reads the same decisions).
Per child: the step's median wall time (each step waited for), the calls of command-buffer
computations in the compiled step's HLO (0 where XLA forms its command buffers from the
thunks instead, after the HLO), our custom calls in it, and the first value (off and on
must agree).
The handler itself is unchanged; only its registration differs, so a step that fails
with the trait on is the answer too. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

GRAPHABLE = ("jax_autotune_cublaslt", "jax_autotune_cublaslt_epilogue")  # never the grouped GEMM: it waits on the host


def _child(model: str, variant: str, traits: bool, steps: int) -> dict:
    import jax

    if traits:  # before the package registers its targets (lazily, at the first GPU tuning)
        from jax._src.lib import xla_client
        register = jax.ffi.register_ffi_target

        def with_traits(name, fn, platform="cpu", api_version=1, **kwargs):
            if name in GRAPHABLE:
                kwargs["traits"] = xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE
            return register(name, fn, platform, api_version, **kwargs)

        jax.ffi.register_ffi_target = with_traits

    import jax_autotune as jat
    import model_step
    from step_models import make_case

    case = make_case(model, variant, model_step.sizes_of(model, "real"), "bfloat16")
    if variant != "plain":
        jat.warmup(case.fn, *case.args, grad=case.grad)
    text = case.step.lower(case.state, case.inputs).compile().as_text()
    state, value = case.step(case.state, case.inputs)
    first = float(value)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, value = case.step(state, case.inputs)
        jax.block_until_ready(value)
        times.append(time.perf_counter() - start)
    return {"model": model, "variant": variant, "traits": traits, "step_ms": statistics.median(times) * 1e3,
            "first_value": first, "command_buffer_calls": len(re.findall(r"(?:to_apply|calls)=%?command_buffer", text)),
            "our_custom_calls": sum(text.count(f'custom_call_target="{name}"') for name in GRAPHABLE),
            "jax": jax.__version__, "device": jax.devices()[0].device_kind}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="command_buffer_probe.json")
    parser.add_argument("--models", default="decode")
    parser.add_argument("--variants", default="layers,autotune")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout-s", type=float, default=200)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, variant, traits = args.child
        print(json.dumps(_child(model, variant, traits == "on", args.steps)), flush=True)
        return
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as store:
            env = {**os.environ, "JAX_AUTOTUNE_CACHE_DIR": store}
            runs = [("plain", "off")] + [(v, t) for v in args.variants.split(",") for t in ("off", "on")]
            for variant, traits in runs:
                cmd = [sys.executable, __file__, "--steps", str(args.steps), "--child", model, variant, traits]
                try:
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
                    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                    row = json.loads(lines[-1]) if lines else {
                        "model": model, "variant": variant, "traits": traits == "on",
                        "error": done.stderr.strip()[-600:] or f"exit {done.returncode}"}
                except subprocess.TimeoutExpired:
                    row = {"model": model, "variant": variant, "traits": traits == "on", "error": "timed out"}
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
