// cuBLASLt matmuls on NVIDIA GPUs as an XLA FFI handler (platform "CUDA").
//
// No CUDA header or library is needed to build or import the module: the library is
// loaded at run time (dlopen) from a path Python supplies (the cuBLASLt that XLA itself
// loaded, kernels/gpu/cublaslt.py), so the same build serves CPU-only machines.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jat {

// Loads `path` and the cuBLASLt entry points; "" or why it failed. Once loaded, a later
// call changes nothing and returns "".
//
//   load_cublaslt("/.../nvidia/cu13/lib/libcublasLt.so.13");
std::string load_cublaslt(const std::string& path);

// The path of the loaded library ("" when none is) and its cublasLtGetVersion() (0).
std::string cublaslt_library();
size_t cublaslt_version();

// (FFI target name, handler) of the CUDA handlers; native.py registers them for "CUDA".
std::vector<std::pair<const char*, XLA_FFI_Handler*>> cuda_ffi_handlers();

}  // namespace jat
