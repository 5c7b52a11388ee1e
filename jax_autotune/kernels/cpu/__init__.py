"""Internal: the native CPU kernels (``native``: C++ XLA FFI custom calls) and their
candidate set (``candidates``). Importing either loads the compiled extension."""
