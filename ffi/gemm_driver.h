// The packed, cache-blocked GEMM around a register-tile micro-kernel (BLIS loop order).
#pragma once

#include "kernel_table.h"

namespace jat {

// C[b] = op(A[b]) * op(B[b]) for every batch element with the micro-kernel of `tile`,
// on up to `threads` threads (over M blocks, or N slivers when M is too short, or over
// batch elements when each matrix is small).
//
//   gemm<float>(problem, kernels_for(Isa::kAvx2).tiles[0], /*threads=*/2);
template <typename T>
void gemm(const BatchedMatmul<T>& problem, const GemmTile& tile, int threads);

}  // namespace jat
