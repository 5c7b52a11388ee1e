"""One training step timed the ways a loop and warmup's program check run it.

    python benchmarks/step_timing_modes.py --out benchmarks/results [--model vit] [--variants plain,layers]

A training loop feeds each step's outputs to the next step, so its arguments sit at new
addresses every step (unless it donates them); warmup's program check
(``jax_autotune/program_check.py``) ran a compiled program on the same argument buffers each
time until it alternated them with a copy. Where two ways disagree on a program's time, the
check judges a program the loop does not run. Modes, each the median wall ms of ``--steps``
steps in turns across variants, waited for every step but ``unsynced``:

* ``fixed``: the same arguments every step, the outputs dropped (the check's earlier way);
* ``fed``: the outputs fed back (``model_step.py``'s way, no donation);
* ``donated``: fed back through the step jitted with ``donate_argnums=0`` (params and
  optimizer state donated, as flax and MaxText loops do);
* ``unsynced``: fed back, ``--steps`` steps dispatched then waited for once (per step).

Run it twice, once with ``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` (XLA's CUDA graphs
off), to see what the command buffers' updates cost each mode. ``--size tiny`` runs on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import write_results  # noqa: E402

MODES = ("fixed", "fed", "donated", "unsynced")


def donating(case):
    """``case`` with a step that donates its (params, opt_state) state."""
    import jax

    return dataclasses.replace(case, step=jax.jit(lambda state, batch: case.step(state, batch), donate_argnums=0))


def timed_modes(cases: dict, steps: int) -> dict:
    """{variant: {mode: median ms}} with every variant timed in turns per mode; each step
    timed as ``model_step.py`` times it (``timed_step``)."""
    import jax
    import jax.numpy as jnp

    from model_step import timed_step

    def copied(state):
        return jax.block_until_ready(jax.tree.map(lambda x: jnp.array(x, copy=True), state))

    ways = {name: {"fixed": case, "fed": case, "donated": donating(case)} for name, case in cases.items()}
    states = {name: {mode: copied(case.state) for mode in ways[name]} for name, case in cases.items()}
    runs = {name: {mode: [] for mode in ways[name]} for name in cases}
    for turn in range(steps + 1):  # the first turn compiles, untimed
        for name in cases:
            for mode, case in ways[name].items():
                state, _, seconds = timed_step(case, states[name][mode])
                if mode != "fixed":  # fixed: the outputs dropped, the same arguments again
                    states[name][mode] = state
                if turn:
                    runs[name][mode].append(seconds)
    result = {name: {mode: statistics.median(seconds) * 1e3 for mode, seconds in runs[name].items()}
              for name in cases}
    for name, case in cases.items():
        state, start = states[name]["fed"], time.perf_counter()
        for _ in range(steps):
            state, value = case.step(state, case.inputs)
        jax.block_until_ready((state, value))
        result[name]["unsynced"] = (time.perf_counter() - start) / steps * 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--model", default="vit")
    parser.add_argument("--variants", default="plain,layers")
    parser.add_argument("--size", default="real")
    parser.add_argument("--param-dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    import jax

    from model_step import sizes_of
    from step_models import make_case

    cases = {}
    for variant in args.variants.split(","):
        cases[variant] = make_case(args.model, variant, sizes_of(args.model, args.size), args.param_dtype)
        if variant != "plain":
            cases[variant].warmup()
    result = timed_modes(cases, args.steps)
    flags = os.environ.get("XLA_FLAGS", "")
    graphs = "off" if "--xla_gpu_enable_command_buffer= " in flags + " " else "XLA's default"
    command = "python benchmarks/step_timing_modes.py " + " ".join(sys.argv[1:])
    lines = [f"# One {args.model} step timed four ways on {jax.devices()[0].device_kind}, {datetime.date.today()}", "",
             f"jax {jax.__version__}; command: `{command}`; XLA_FLAGS `{flags}` (CUDA graphs: {graphs})", "",
             "| variant | " + " | ".join(f"{mode} ms" for mode in MODES) + " | fed / fixed |",
             "|---|" + "---|" * (len(MODES) + 1)]
    for name, ms in result.items():
        lines.append(f"| {name} | " + " | ".join(f"{ms[mode]:.2f}" for mode in MODES)
                     + f" | {ms['fed'] / ms['fixed']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    tag = "default" if graphs == "XLA's default" else "no_command_buffers"
    write_results(args.out, f"step_timing_modes_{datetime.date.today()}_{args.model}_{tag}", text,
                  {"model": args.model, "size": args.size, "xla_flags": flags, "command": command,
                   "device": jax.devices()[0].device_kind, "jax": jax.__version__, "ms": result})


if __name__ == "__main__":
    main()
