"""Tune tables as orbax checkpoint items (the documented import path).

    >>> from jax_autotune.checkpoint import TuneTableRestore, TuneTableSave

The implementation lives in ``jax_autotune.tables.checkpoint``; orbax is optional
(``pip install 'jax_autotune[checkpoint]'``) and loads only when this module is imported.
"""

from jax_autotune.tables.checkpoint import (TUNE_TABLE_FILENAME, TuneTableHandler, TuneTableRestore,
                                            TuneTableSave)

__all__ = ["TUNE_TABLE_FILENAME", "TuneTableHandler", "TuneTableRestore", "TuneTableSave"]
