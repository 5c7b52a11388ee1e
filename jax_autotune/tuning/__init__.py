"""Internal: the tuning engine, one concept per module (no public API here).

Where a key is decided: ``tuner.Tuner.select``, and only there. It asks ``known`` (memory
table, store, one thread per key), says what a miss means under the ``policy``'s mode,
asks ``consensus`` which process decides (an agreement on JSON values that calls no tuner
code: it takes a predicate saying whether a stored value is usable), and benchmarks the key (``bench``).

key -> ``plan`` (rounds) -> ``bench`` (adaptive benchmark, with ``timing``,
``correctness``, ``roofline`` and ``probes``) -> ``decision`` -> ``store`` (the
``store_protocol`` and its backends: ``sqlite_store``, ``directory_store``, ``memory_store``),
driven by ``tuner.Tuner``; ``candidates`` are the types kernel families are built from,
``device`` the facts a candidate may ask of a device, ``rules`` every constant of the
benchmark, ``counters`` what ``jax_autotune.stats()`` reports. Nothing here imports a
kernel family: the registry (``jax_autotune.registry``) hands each Tuner its candidate set.
"""
