// The per-ISA kernel table: plain function pointers, filled by one kernels_<isa>.cc each.
//
// This header holds only PODs and declarations: it is included by translation units
// compiled with different -m flags, so it must not define any inline code (an inline
// function compiled with -mavx2 in one TU could be the copy the linker keeps for all).
#pragma once

#include <cstdint>

namespace jat {

enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kIsaCount = 3;

// One batch of canonical matmuls: C[b] (m x n) = op(A[b]) (m x k) * op(B[b]) (k x n), all
// row-major as stored; A[b] is stored (k x m) when transpose_a, B[b] (n x k) when transpose_b.
template <typename T>
struct BatchedMatmul {
  const T* a;
  const T* b;
  T* c;
  int64_t batch, m, n, k;
  bool transpose_a, transpose_b;
};

// C tile (rows <= mr, cols <= nr) = or += packed A sliver (kc x mr) * packed B sliver (kc x nr).
template <typename T>
using MicroKernelFn = void (*)(int64_t kc, const T* a_packed, const T* b_packed, T* c,
                               int64_t ldc, int rows, int cols, bool accumulate);

// Small matmuls (m, n, k <= 32) for batch elements [begin, end).
template <typename T>
using SmallFn = void (*)(const BatchedMatmul<T>& problem, int64_t begin, int64_t end);

// y[r] = dot(a[r * lda : r * lda + cols], x) for r < rows.
template <typename T>
using RowDotsFn = void (*)(const T* a, int64_t rows, int64_t cols, int64_t lda, const T* x,
                           T* y);

// y[0:cols] = sum_r x[r] * a[r * lda : r * lda + cols].
template <typename T>
using RowAxpysFn = void (*)(const T* a, int64_t rows, int64_t cols, int64_t lda, const T* x,
                            T* y);

// Throughput probe: `iterations` rounds of kFmaChains independent vector FMA chains;
// returns a value derived from the result so the loop cannot be dropped.
using FmaLoopFn = double (*)(int64_t iterations);
constexpr int kFmaChains = 12;

constexpr int kTilesPerIsa = 2;
constexpr int kSmallMaxDim = 32;

struct GemmTile {
  int mr;          // rows of the register tile (both dtypes)
  int nr_f32;      // columns of the register tile for f32 ...
  int nr_f64;      // ... and for f64 (same number of vector registers)
  MicroKernelFn<float> f32;
  MicroKernelFn<double> f64;
};

struct KernelTable {
  const char* isa_name;
  GemmTile tiles[kTilesPerIsa];
  SmallFn<float> small_f32;
  SmallFn<double> small_f64;
  RowDotsFn<float> row_dots_f32;
  RowDotsFn<double> row_dots_f64;
  RowAxpysFn<float> row_axpys_f32;
  RowAxpysFn<double> row_axpys_f64;
  FmaLoopFn fma_loop_f32;
  FmaLoopFn fma_loop_f64;
  int vector_bytes;  // so flops per FMA round = kFmaChains * 2 * vector_bytes / sizeof(T)
};

// Defined by kernels_<isa>.cc (the avx ones only on x86-64 builds). These declarations also
// give the definitions external linkage (a namespace-scope const is internal otherwise).
extern const KernelTable kPortableKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

}  // namespace jat
