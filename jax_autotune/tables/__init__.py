"""Internal: shipping decisions between processes and machines.

``table_file`` is the portable tune-table format and its validation (pure: no tuners,
no stores); ``summary`` its one-line-per-decision presentation; ``install`` moves
decisions between a table and this process's tuners and stores; ``checkpoint`` wraps a
table as an orbax checkpoint item (documented path: ``jax_autotune.checkpoint``).
"""
