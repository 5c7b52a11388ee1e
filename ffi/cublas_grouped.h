// cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, cuBLAS 12.5 and newer) as an XLA FFI
// handler for the CUDA platform: the grouped matmuls of lax.ragged_dot.
//
// As cublaslt.h, nothing CUDA is linked: cuBLAS and the CUDA driver (libcuda) are loaded
// at run time from paths Python supplies (kernels/gpu/cublas_grouped.py).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jat {

// Loads cuBLAS from `cublas_path` and the CUDA driver from `driver_path`, and their entry
// points; "" or why it failed. Once loaded, a later call changes nothing and returns "".
//
//   load_cublas_grouped("/.../libcublas.so.13", "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
std::string load_cublas_grouped(const std::string& cublas_path, const std::string& driver_path);

// The path of the loaded cuBLAS ("" when none is).
std::string cublas_grouped_library();

// Why the handler refuses these attributes ("" when it takes them), checked before it
// touches a buffer; f32_operands: lhs and rhs are float32.
//
//   cublas_grouped_attribute_error(false, 1, 1, 0);  // "...: attribute transpose_b must be 0 with ragged_k 1, got 1"
std::string cublas_grouped_attribute_error(bool f32_operands, int64_t ragged_k, int64_t transpose_b,
                                           int64_t tf32);

// (FFI target name, handler) of the grouped GEMM, for the CUDA platform.
std::vector<std::pair<const char*, XLA_FFI_Handler*>> cublas_grouped_handlers();

}  // namespace jat
