"""One process of a consensus test (tests/test_consensus.py starts several).

    python consensus_worker.py SCENARIO PROCESS_ID COUNT PORT OUTDIR

SCENARIO: ``job`` (a jax.distributed job warms up SHAPES), ``host`` (the same without
jax.distributed, sharing one store), ``slow`` (process 1 claims the key and tunes it
after a pause), ``killed`` (process 1 claims the key and hangs until it is killed). It
prints one JSON line: per key its winner and source, and the counters.
"""

import json
import os
import sys
import time

scenario, index, count, port, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
SHAPES = [(16, 16, 16), (64, 48, 32), (96, 64, 128)]

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")
if scenario != "host":
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=count,
                               process_id=index, initialization_timeout=60,
                               heartbeat_timeout_seconds=60, shutdown_timeout_seconds=30)

import jax_autotune as jat  # noqa: E402
from jax_autotune.tuners import tuner_for  # noqa: E402
from jax_autotune.tuning.rules import TuningRules  # noqa: E402
from jax_autotune.tuning.tuner import Tuner  # noqa: E402

tuner = tuner_for("cpu")
tuner.rules = TuningRules(budget_seconds=1.0, peer_wait_seconds=float(os.environ.get("PEER_WAIT_S", "120")))
marker = os.path.join(outdir, "claimed")
shapes = SHAPES

if scenario in ("slow", "killed"):
    shapes = SHAPES[:1]
    if index == 1:
        tune = Tuner._tune

        def claimed_then(self, key, problem, policy):
            open(marker, "w").close()  # this process holds the claim now
            time.sleep(3600 if scenario == "killed" else 2.0)
            return tune(self, key, problem, policy)
        Tuner._tune = claimed_then
    else:
        deadline = time.time() + 120
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.02)  # process 1 claims first

report = jat.warmup(shapes, progress=False)
print(json.dumps({"process": index, "stats": jat.stats(),
                  "keys": {e.key.canonical(): {"winner": e.winner, "source": e.source} for e in report}}),
      flush=True)
if scenario in ("job", "slow"):  # the coordinator (process 0) must outlive its peers' questions
    jax.distributed.shutdown()
    sys.exit(0)
os._exit(0)  # a killed peer would fail jax.distributed's shutdown barrier
