"""How a host clock compares a key's leader with XLA's dot after the rounds, four ways.

    python benchmarks/paired_probe.py --cores 2 --n 1000 --tunings 3

Each tuning (a fresh store, a process pinned to ``--cores``) runs ``jat.warmup`` on an
n^3 f32 matmul; after its rounds, before the tuner's own comparison in turns, the leader
and XLA's dot are timed again in turns, 8 pairs each way: single samples, a discarded
warm-up sample before each, samples four times as long, and single samples again. Printed
per tuning: XLA's dot's time over the leader's (sequential scores, then the median of each
way's pairs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile


def _child(n: int) -> None:
    import jax

    import jax_autotune as jat
    from jax_autotune.tuning import bench

    original = bench.KeyBenchmark.compare_in_turns

    def probed(self, baseline):
        others = [r for r in self.results.values() if r.eligible and r.name != baseline]
        if others:
            name = min(others, key=lambda r: r.score).name
            runs = {name: self.compiles.measured(name), baseline: self.compiles.measured(baseline)}

            def in_turns(sample, pairs=8):
                ratios = []
                for p in range(pairs):
                    order = (name, baseline) if p % 2 == 0 else (baseline, name)
                    seconds = {who: sample(runs[who]) for who in order}
                    ratios.append(seconds[baseline] / seconds[name])
                return statistics.median(ratios)

            ways = {"warm": lambda m: (m.sample(), m.sample())[1], "single": lambda m: m.sample(),
                    "long4": lambda m: m.time(4 * m.reps) / (4 * m.reps), "single_again": lambda m: m.sample()}
            seq = self.results[baseline].score / self.results[name].score
            print(name, f"sequential={seq:.3f}", *(f"{w}={in_turns(f):.3f}" for w, f in ways.items()), flush=True)
        return original(self, baseline)

    bench.KeyBenchmark.compare_in_turns = probed
    a, b = (jax.random.normal(jax.random.key(i), (n, n)) for i in range(2))
    jat.warmup(lambda a, b: jat.matmul(a, b), a, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--tunings", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.n)
        return
    for _ in range(args.tunings):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "JAX_AUTOTUNE_CACHE_DIR": cache}
            cmd = ["taskset", "-c", f"0-{args.cores - 1}", sys.executable, __file__, "--child", "--n", str(args.n)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            print(done.stdout.strip() or done.stderr.strip()[-400:], flush=True)


if __name__ == "__main__":
    main()
