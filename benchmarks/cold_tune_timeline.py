"""Where a cold tune's wall time goes, per key: phases, and a timeline of each candidate's
compile and measurement; then whether candidate compiles overlap in threads.

    python benchmarks/cold_tune_timeline.py --out /tmp/timeline [--keys bf16:1024,bf16:768]

For each key (a fresh process-wide tuner, so the first key pays for the probes):
* ``phase_seconds`` of the decision (operands, reference, probes, rounds) and the wall
  time of each probe;
* per candidate: compile start/end and first-run / sampling start/end, relative to the
  start of the tune;
then, for the last key, the same candidates compiled serially and in threads (fresh jit
each time, so nothing is cached in memory), with a cProfile of the serial compiles
(lowering in Python versus XLA's compile) written next to the JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import cProfile
import json
import os
import pstats
import sys
import tempfile
import threading
import time

DTYPES = {"bf16": "bfloat16", "f32": "float32"}


def parse_key(text: str):
    dtype, _, dims = text.partition(":")
    sizes = [int(d) for d in dims.split("x")]
    m, n, k = sizes if len(sizes) == 3 else sizes * 3
    return DTYPES[dtype], m, n, k


class TimelineTimer:
    """Wraps a Timer: records when each candidate compiles, first runs and samples."""

    def __init__(self, inner, origin: list[float]):
        self.inner, self.origin = inner, origin
        self.name = inner.name
        self.measures_device_time = inner.measures_device_time
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def _event(self, name, stage, start, end):
        with self.lock:
            self.events.append({"name": name, "stage": stage, "start": start - self.origin[0],
                                "end": end - self.origin[0], "thread": threading.current_thread().name})

    def _recorded(self, name, stage, fn):
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self._event(name, stage, start, time.perf_counter())

    def prepare(self, candidate, problem, args):
        name = candidate.name
        measurement = self._recorded(name, "compile", lambda: self.inner.prepare(candidate, problem, args))
        timer = self

        class Recorded:
            def output(self):
                return timer._recorded(name, "first_run", measurement.output)

            def sample(self):
                return timer._recorded(name, "sample", measurement.sample)

        return Recorded()


def compile_all(candidates, problem, args, threads: int) -> float:
    import jax

    def one(candidate):
        jax.jit(lambda a, b: candidate.fn(a, b, problem)).lower(*args).compile()

    start = time.perf_counter()
    if threads <= 1:
        for c in candidates:
            one(c)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, candidates))
    return time.perf_counter() - start


def serial_costs(tuner, problem) -> dict:
    """Wall seconds of each step of a tune's set-up, one at a time (nothing overlaps)."""
    import jax
    from jax_autotune.tuning import correctness
    from jax_autotune.tuning.timing import random_operands
    from jax_autotune.kernels.xla import xla_dot

    costs = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        costs[name] = round(time.perf_counter() - start, 4)
        return out

    device = tuner._jax_device()
    lhs, rhs = timed("operands", lambda: random_operands(problem, device, seed=11))
    ref = timed("reference", lambda: correctness.reference(problem, lhs, rhs, host_max_macs=0))
    correctness._compiled_summary.cache_clear()
    timed("check_compile", lambda: correctness.prepare_check(problem, ref, device))
    out = timed("baseline_compile_and_run",
                lambda: jax.jit(lambda a, b: xla_dot(a, b, problem)).lower(lhs, rhs).compile()(lhs, rhs))
    timed("check", lambda: correctness.check(out, ref, problem, trusted=out).rel_error)
    return costs


def timed_probes() -> dict[str, float]:
    """From now on, the wall time of each probe (compile included), by name."""
    from jax_autotune.tuning.probes import Probes
    probe_seconds: dict[str, float] = {}
    original_get = Probes.get

    def timed_get(self, name, measure):
        start = time.perf_counter()
        try:
            return original_get(self, name, measure)
        finally:
            probe_seconds.setdefault(name, time.perf_counter() - start)

    Probes.get = timed_get
    return probe_seconds


def timeline_of(tuner, timer, origin, text: str) -> dict:
    """Tune one key (``dtype:MxNxK``), its decision and the timeline of its compiles and runs."""
    from jax_autotune.problem import MatmulProblem
    from jax_autotune import config
    dtype, m, n, k = parse_key(text)
    problem = MatmulProblem(1, m, n, k, dtype, dtype, dtype)
    timer.events = []
    origin[0] = time.perf_counter()
    decision = tuner.select(problem, policy=config.policy())
    wall = time.perf_counter() - origin[0]
    entry = {"key": text, "wall_s": wall, "winner": decision.winner,
             "phase_seconds": decision.bounds.get("phase_seconds"),
             "results": [{"name": r.name, "outcome": r.outcome, "compile_s": r.compile_seconds,
                          "compile_wait_s": r.compile_wait_seconds,
                          "score_us": None if r.score is None else r.score * 1e6}
                         for r in decision.results],
             "timeline": sorted(timer.events, key=lambda e: e["start"])}
    print(f"{text}: {wall:.2f} s winner {decision.winner} phases "
          f"{json.dumps({k: round(v, 3) for k, v in (entry['phase_seconds'] or {}).items()})}", flush=True)
    spans: dict[tuple, list] = {}
    for e in entry["timeline"]:
        spans.setdefault((e["name"], e["stage"] if e["stage"] == "compile" else "run"), []).append(e)
    for (name, stage), events in spans.items():
        print(f"   {stage:8s} {events[0]['start']:7.3f} -> {events[-1]['end']:7.3f} "
              f"({sum(e['end'] - e['start'] for e in events):6.3f} s, {len(events)} ev) {name}")
    return entry


def compile_experiment(tuner, problem, out: str) -> dict:
    """The compiles of ``problem``'s plan: serial (profiled into out/profile.txt) against threads."""
    from jax_autotune.tuning.plan import make_plan
    from jax_autotune.tuning.timing import random_operands
    plan = make_plan(tuner.candidate_set, problem.key(), tuner.device)
    candidates = [plan.baseline] + [c for r in plan.runnable for c in r.candidates]
    operands = random_operands(problem, tuner._jax_device(), seed=3)
    profile = cProfile.Profile()
    profile.enable()
    serial = compile_all(candidates, problem, operands, 1)
    profile.disable()
    threaded = compile_all(candidates, problem, operands, len(candidates))
    serial_again = compile_all(candidates, problem, operands, 1)
    print(f"compile {len(candidates)} candidates: serial {serial:.2f} s, threaded {threaded:.2f} s, "
          f"serial again {serial_again:.2f} s", flush=True)
    with open(os.path.join(out, "profile.txt"), "w") as f:
        stats = pstats.Stats(profile, stream=f)
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(40)
    return {"candidates": [c.name for c in candidates], "serial_s": serial,
            "threaded_s": threaded, "serial_again_s": serial_again}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--keys", default="bf16:1024,bf16:768,f32:1025,bf16:16x8192x8192,bf16:4096")
    parser.add_argument("--serial", default="", help="keys whose set-up steps are timed one by one")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("JAX_AUTOTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="timeline_"))

    import jax
    from jax_autotune.problem import MatmulProblem
    from jax_autotune.registry import tuner_for

    probe_seconds = timed_probes()
    t_import = time.perf_counter()
    tuner = tuner_for(jax.default_backend())
    origin = [0.0]
    timer = TimelineTimer(tuner.timer, origin)
    tuner.timer = timer
    print(f"tuner built in {time.perf_counter() - t_import:.2f} s", flush=True)
    keys = args.keys.split(",")
    report = {"jax": jax.__version__, "keys": [timeline_of(tuner, timer, origin, text) for text in keys]}
    report["serial_costs"] = {}
    for text in filter(None, args.serial.split(",")):
        dtype, m, n, k = parse_key(text)
        report["serial_costs"][text] = serial_costs(tuner, MatmulProblem(1, m, n, k, dtype, dtype, dtype))
        print(f"serial {text}: {json.dumps(report['serial_costs'][text])}", flush=True)
    report["probe_seconds"] = probe_seconds
    print("probes (s, compile included):", json.dumps({k: round(v, 3) for k, v in probe_seconds.items()}))
    dtype, m, n, k = parse_key(keys[-1])
    report["compile_experiment"] = compile_experiment(tuner, MatmulProblem(1, m, n, k, dtype, dtype, dtype), args.out)
    with open(os.path.join(args.out, "timeline.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
