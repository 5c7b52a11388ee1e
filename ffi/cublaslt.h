// cuBLASLt matmuls on NVIDIA GPUs as an XLA FFI handler (platform "CUDA").
//
// No CUDA header or library is needed to build or import the module: the library is
// loaded at run time (dlopen) from a path Python supplies (the cuBLASLt that XLA itself
// loaded, kernels/gpu/cublaslt.py), so the same build serves CPU-only machines.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jat {

// Algorithms asked of cuBLASLt's heuristic per problem: the `algorithm` attribute is below it.
constexpr int kCublasLtMaxAlgorithms = 8;

// Loads `path` and the cuBLASLt entry points; "" or why it failed. Once loaded, a later
// call changes nothing and returns "".
//
//   load_cublaslt("/.../nvidia/cu13/lib/libcublasLt.so.13");
std::string load_cublaslt(const std::string& path);

// The path of the loaded library ("" when none is) and its cublasLtGetVersion() (0).
std::string cublaslt_library();
size_t cublaslt_version();

// Why the handler refuses these attributes ("" when it takes them), checked before it
// touches a buffer or the library; f32_operands: lhs and rhs are float32.
//
//   cublaslt_attribute_error(true, 0, 0, 1, 9);  // "...: attribute algorithm must be 0 to 7, got 9"
std::string cublaslt_attribute_error(bool f32_operands, int64_t transpose_a, int64_t transpose_b,
                                     int64_t tf32, int64_t algorithm);

// The same for the epilogue target's own attributes.
//
//   cublaslt_epilogue_attribute_error(1, 1, 1);  // "...: attribute activation must be 0 (none) with a residual, got 1"
std::string cublaslt_epilogue_attribute_error(int64_t activation, int64_t has_bias,
                                              int64_t has_residual);

// (FFI target name, handler) of the CUDA handlers; native.py registers them for "CUDA".
std::vector<std::pair<const char*, XLA_FFI_Handler*>> cuda_ffi_handlers();

}  // namespace jat
