"""Where a training step's device time goes, kernel by kernel: plain against tuned.

    python benchmarks/step_profile.py --out benchmarks/results [--models gpt2] [--variants plain,autotune]

For each model and variant (``benchmarks/step_models.py``): warm up (the tuned variants,
``compare=False``: the program as its keys were decided, before warmup's whole-program
check; ``--checked``: after it, the program the step runs), run three steps, then one step
(``--programs value_and_grad``: the loss's value and gradient alone, the program warmup's check
of ``loss`` with ``grad=True`` times, so that a step's cost outside it shows) under CUPTI (``jax.experimental.mosaic.gpu.profiler``, every kernel's device time). Kernels are put in classes by name: ``gemm`` (cuBLAS, cuBLASLt,
XLA's Triton GEMM fusions, our Pallas and Mosaic GEMMs), ``layout`` (transposes and copies),
``convert``, ``reduction`` and ``elementwise`` (every other fusion). The report gives each
class's total and count per variant and the difference, and the largest kernels. GPU only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLASSES = (  # (class, name fragments), the first that matches
    ("gemm", ("gemm", "xmma", "nvjet", "cutlass", "wgmma", "matmul", "cublas", "mosaic", "dot_")),
    ("layout", ("transpose", "copy")),
    ("convert", ("convert",)),
    ("reduction", ("reduce", "softmax", "scatter")),
)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    return next((label for label, parts in CLASSES if any(p in lowered for p in parts)), "elementwise")


def profile(model: str, variant: str, size: str, param_dtype: str, checked: bool = False,
            program: str = "step") -> dict:
    """{class: [ms, count]}, the top kernels and the summed device ms of the step, or with
    ``program="value_and_grad"`` of the loss's value and gradient alone (its variant labelled so)."""
    import jax
    from jax.experimental.mosaic.gpu import profiler

    from model_step import sizes_of
    from step_models import make_case

    case = make_case(model, variant, sizes_of(model, size), param_dtype)
    if variant != "plain":
        case.warmup(compare=checked)
    if program == "value_and_grad":
        run, operands = jax.jit(jax.value_and_grad(case.fn)), case.args
        variant = f"{variant} value_and_grad"
    else:
        run, operands = case.step, (case.state, case.inputs)
    for _ in range(3):
        jax.block_until_ready(run(*operands))
    _, kernels = profiler.measure(run, aggregate=False)(*operands)
    classes: dict = collections.defaultdict(lambda: [0.0, 0])
    for name, ms in kernels:
        entry = classes[kernel_class(name)]
        entry[0] += ms
        entry[1] += 1
    by_name: dict = collections.defaultdict(float)
    for name, ms in kernels:
        by_name[name[:90]] += ms
    top = sorted(by_name.items(), key=lambda item: -item[1])[:25]
    return {"model": model, "variant": variant, "total_ms": sum(ms for _, ms in kernels),
            "kernels": len(kernels), "classes": dict(classes), "top": top}


def report(rows: list[dict], command: str, device: str, jax_version: str, checked: bool = False) -> str:
    lines = [f"# Training-step device time by kernel class ({datetime.date.today()})", "",
             f"`{command}` on {device}, jax {jax_version}; one step under CUPTI, ms (kernels); the tuned "
             f"variants {'after' if checked else 'before'} warmup's whole-program check.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["model"] == model}
        variants = list(mine)
        lines += [f"## {model}", "", "| class | " + " | ".join(variants) + " | "
                  + " | ".join(f"{v} - {variants[0]}" for v in variants[1:]) + " |",
                  "|---" * (2 * len(variants)) + "|"]
        for label in [c for c, _ in CLASSES] + ["elementwise", "total"]:
            def cell(v):
                if label == "total":
                    return mine[v]["total_ms"], mine[v]["kernels"]
                return tuple(mine[v]["classes"].get(label, (0.0, 0)))
            base = cell(variants[0])
            lines.append(f"| {label} | " + " | ".join(f"{cell(v)[0]:.2f} ({cell(v)[1]})" for v in variants)
                         + " | " + " | ".join(f"{cell(v)[0] - base[0]:+.2f} ({cell(v)[1] - base[1]:+d})"
                                              for v in variants[1:]) + " |")
        for v in variants:
            lines += ["", f"Largest kernels, {v}:", ""]
            lines += [f"- {ms:.3f} ms `{name}` ({kernel_class(name)})" for name, ms in mine[v]["top"][:12]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--variants", default="plain,autotune")
    parser.add_argument("--size", default="real", choices=("real", "tiny"))
    parser.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--checked", action="store_true",
                        help="profile the tuned program after warmup's whole-program check (what the step runs)")
    parser.add_argument("--programs", default="step", choices=("step", "value_and_grad", "step,value_and_grad"),
                        help="what is profiled: the training step, the loss's value and gradient alone, or both")
    args = parser.parse_args()
    import jax

    rows = [profile(m, v, args.size, args.param_dtype, args.checked, program)
            for m in args.models.split(",") for v in args.variants.split(",") for program in args.programs.split(",")]
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    command = "python benchmarks/step_profile.py " + " ".join(sys.argv[1:])
    with open(os.path.join(args.out, f"step_profile_{stamp}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    text = report(rows, command, jax.devices()[0].device_kind, jax.__version__, args.checked)
    with open(os.path.join(args.out, f"step_profile_{stamp}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
