"""Tune tables as orbax checkpoint items: ship kernel choices next to the parameters.

``TuneTableSave(table)`` and ``TuneTableRestore(install=True)`` are orbax
``CheckpointArgs`` served by ``TuneTableHandler``, which writes the table as one JSON file
(``tune_table.json``) in the item's directory and reads it back through the validating
``load_table``: nothing is ever pickled or unpickled.

    >>> import orbax.checkpoint as ocp, jax_autotune as jat
    >>> from jax_autotune.checkpoint import TuneTableRestore, TuneTableSave
    >>> mngr = ocp.CheckpointManager(path)
    >>> mngr.save(step, args=ocp.args.Composite(
    ...     params=ocp.args.StandardSave(params), tune_table=TuneTableSave(jat.table())))
    >>> restored = mngr.restore(step, args=ocp.args.Composite(
    ...     params=ocp.args.StandardRestore(abstract_params), tune_table=TuneTableRestore()))
    >>> restored.tune_table            # installed for this device (memory table and store)
    TuneTable(1 devices, 6 entries)

orbax is an optional dependency (``pip install 'jax_autotune[checkpoint]'``); only this
module imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

try:
    import orbax.checkpoint as ocp
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("jax_autotune.checkpoint needs orbax-checkpoint: "
                      "pip install 'jax_autotune[checkpoint]'") from err

from jax_autotune.tables.install import load_table
from jax_autotune.tables.table_file import TuneTable

__all__ = ["TUNE_TABLE_FILENAME", "TuneTableHandler", "TuneTableRestore", "TuneTableSave"]

TUNE_TABLE_FILENAME = "tune_table.json"


class TuneTableHandler(ocp.CheckpointHandler):
    """Saves a ``TuneTable`` as ``tune_table.json`` in the item directory (primary process
    only) and restores it with validation, installing the current device's entries."""

    def save(self, directory, args: "TuneTableSave | None" = None, item: Any = None) -> None:
        tune_table = args.table if args is not None else item
        if not isinstance(tune_table, TuneTable):
            raise TypeError(f"TuneTableSave.table: expected a jax_autotune TuneTable, "
                            f"got {type(tune_table).__name__}")
        if jax.process_index() == 0:
            (directory / TUNE_TABLE_FILENAME).write_text(tune_table.dumps())  # an epath: maybe remote

    def restore(self, directory, args: "TuneTableRestore | None" = None,
                item: Any = None) -> TuneTable:
        path = directory / TUNE_TABLE_FILENAME
        if not path.exists():
            raise FileNotFoundError(f"no tune table in the checkpoint item {directory} "
                                    f"(expected {TUNE_TABLE_FILENAME})")
        return load_table(path, install=args is None or args.install)

    def metadata(self, directory) -> dict[str, Any] | None:
        path = directory / TUNE_TABLE_FILENAME
        return {"file": TUNE_TABLE_FILENAME} if path.exists() else None


@ocp.args.register_with_handler(TuneTableHandler, for_save=True)
@dataclasses.dataclass
class TuneTableSave(ocp.args.CheckpointArgs):
    """Save ``table`` (a ``TuneTable``, e.g. ``jax_autotune.table()``) as a checkpoint item.

        >>> ocp.args.Composite(params=ocp.args.StandardSave(params),
        ...                    tune_table=TuneTableSave(jat.table()))
    """

    table: TuneTable

    def __post_init__(self):
        if not isinstance(self.table, TuneTable):
            raise TypeError(f"TuneTableSave.table: expected a jax_autotune TuneTable (e.g. "
                            f"jax_autotune.table()), got {type(self.table).__name__}")


@ocp.args.register_with_handler(TuneTableHandler, for_restore=True)
@dataclasses.dataclass
class TuneTableRestore(ocp.args.CheckpointArgs):
    """Restore a ``TuneTable`` item; with ``install`` (default) its entries for the current
    device(s) go into the memory table and the store (``jax_autotune.load_table``).

        >>> ocp.args.Composite(params=ocp.args.StandardRestore(abstract),
        ...                    tune_table=TuneTableRestore())
    """

    install: bool = True
