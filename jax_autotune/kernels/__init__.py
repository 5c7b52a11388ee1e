"""Internal: the kernels a key may run with, as candidate families.

``xla`` is XLA's own dot (the baseline of every round), ``cpu/`` the native C++ kernels
(XLA FFI custom calls) and their candidate set, ``gpu/`` the Pallas Triton and Mosaic GPU
kernels and theirs. Each family imports only the tuning engine's types.
"""
