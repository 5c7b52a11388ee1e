"""The launch-overhead probe against a long measurement of the same launch.

    python benchmarks/probe_overhead.py [--platform cpu|gpu] [--repeats 5] [--out DIR]

The probe (``probes.sample_launch_overhead``) must stop within 2,000 launches and 0.3 s;
the long measurement takes the median over ``--long-launches`` launches of the same
executable. The table gives each probe's launches, seconds, value and its deviation from
the long value (goal: within 10%). The reference's probe spends 18k-250k launches, ~3.6 s.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import jax
from report import write_results

from jax_autotune.tuning.probes import LAUNCH_MAX, LAUNCH_MAX_SECONDS, sample_launch_overhead
from jax_autotune.registry import tuner_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default=jax.default_backend())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long-launches", type=int, default=50_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tuner = tuner_for(args.platform)
    device = tuner.device
    measurement, reps = tuner.probes.launch_measurement()
    sample = lambda: (measurement.sample(), reps)  # noqa: E731
    probes = [sample_launch_overhead(sample) for _ in range(args.repeats)]
    long_samples, launches = [], 0
    while launches < args.long_launches:
        seconds, used = sample()
        long_samples.append(seconds)
        launches += used
    long_value = statistics.median(long_samples)
    date = datetime.date.today().isoformat()
    lines = [f"# Launch-overhead probe vs a long measurement, {date}", "",
             f"Device: {device.device_kind} ({device.platform}); jax {jax.__version__}; one launch = "
             f"{'one FFI call inside an executable' if device.platform == 'cpu' else 'one trivial kernel, device time'}.",
             f"Command: `python benchmarks/probe_overhead.py {' '.join(sys.argv[1:])}`", "",
             f"Long measurement: {launches} launches, median {long_value * 1e6:.3f} us.", "",
             f"| probe run | launches (cap {LAUNCH_MAX}) | seconds (cap {LAUNCH_MAX_SECONDS}) | value us | vs long |",
             "|---|---|---|---|---|"]
    for i, probe in enumerate(probes, 1):
        lines.append(f"| {i} | {probe.launches} | {probe.seconds:.4f} | {probe.value * 1e6:.3f} | "
                     f"{(probe.value / long_value - 1) * 100:+.1f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_results(args.out, f"probe_overhead_{device.platform}_{date}", text,
                      {"long_us": long_value * 1e6, "long_launches": launches,
                       "probes": [p.to_json() for p in probes]})


if __name__ == "__main__":
    main()
