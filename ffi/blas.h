// An optional CBLAS backend, loaded at run time (dlopen) from a path Python supplies.
#pragma once

#include <string>

#include "kernel_table.h"

namespace jat {

// Loads `path` and its `<prefix>cblas_sgemm`, `<prefix>cblas_dgemm` and
// `<prefix>openblas_set_num_threads` symbols; returns "" or why it failed. Once loaded, a
// later call changes nothing and returns "".
//
//   load_blas("/.../libscipy_openblas.so", "scipy_");
std::string load_blas(const std::string& path, const std::string& prefix);

// The path of the loaded library, or "" when none is.
std::string blas_library();

// C[b] = op(A[b]) * op(B[b]) for every batch element with the loaded library's gemm on
// `threads` threads (its own pool). Only call it once blas_library() is not empty, with
// m, n, k below 2**31.
template <typename T>
void blas_gemm(const BatchedMatmul<T>& problem, int threads);

}  // namespace jat
