// Vector-width-generic kernels, compiled once per ISA by kernels_<isa>.cc.
//
// The including TU defines JAT_VEC_BYTES (16, 32 or 64) and is compiled with the matching
// -m flags; GNU vector extensions then lower to SSE2, AVX2+FMA or AVX-512 code. Everything
// here lives in an anonymous namespace so each ISA gets its own copy (no ODR sharing of
// code compiled for different ISAs).
#pragma once

#include <cstdint>

#include "kernel_table.h"

#ifndef JAT_VEC_BYTES
#error "define JAT_VEC_BYTES before including kernels_impl.h"
#endif

namespace jat {
namespace {

constexpr int kVecBytes = JAT_VEC_BYTES;

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = kVecBytes / sizeof(T);

template <typename T>
inline __attribute__((always_inline)) Vec<T> load(const T* p) {
  Vec<T> v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline __attribute__((always_inline)) void store(T* p, Vec<T> v) {
  __builtin_memcpy(p, &v, sizeof(v));
}
template <typename T>
inline __attribute__((always_inline)) T hsum(Vec<T> v) {
  T s = 0;
  for (int i = 0; i < kLanes<T>; ++i) s += v[i];
  return s;
}

// ------------------------------------------------------------------ GEMM micro-kernel

// MR x (NV vectors) register tile; packed A is kc x MR, packed B is kc x NR, both aligned.
template <typename T, int MR, int NV>
void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict c,
                  int64_t ldc, int rows, int cols, bool accumulate) {
  constexpr int W = kLanes<T>;
  constexpr int NR = NV * W;
  Vec<T> acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = Vec<T>{};
  const Vec<T>* bv = reinterpret_cast<const Vec<T>*>(__builtin_assume_aligned(b, 64));
  // the C tile is read (or written) only after the loop: start fetching its lines now
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    __builtin_prefetch(c + i * ldc, 1);
    __builtin_prefetch(c + i * ldc + NR - 1, 1);
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    Vec<T> bp[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bp[v] = bv[p * NV + v];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T ai = a[p * MR + i];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += bp[v] * ai;
    }
  }
  if (rows == MR && cols == NR) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        T* dst = c + i * ldc + v * W;
        store(dst, accumulate ? load(dst) + acc[i][v] : acc[i][v]);
      }
    return;
  }
  // edge tile: the packed operands are zero-padded, so only the store is partial
  alignas(64) T tile[MR * NR];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) store(tile + i * NR + v * W, acc[i][v]);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + tile[i * NR + j] : tile[i * NR + j];
}

// ------------------------------------------------------------------ small matmuls

// Accumulator registers a kernel may use: 16 vector registers (SSE/AVX2) or 32 (AVX-512),
// minus room for the B row and the broadcast.
constexpr int kAccumulatorRegs = kVecBytes == 64 ? 24 : 12;

// Rows rb of C for one batch element: C[i0:i0+rb, :n] = A[i0:i0+rb, :k] * Bp, where Bp is
// k x (NV vectors) with row stride ldb (zero padded past n when n < NV * lanes).
template <typename T, int NV, int RB, bool kPartial>
inline __attribute__((always_inline)) void small_rows(const T* A, int64_t a_row, int64_t a_col,
                                                      const T* Bp, int64_t ldb, T* C,
                                                      int64_t n, int64_t k, int rb) {
  constexpr int W = kLanes<T>;
  Vec<T> acc[RB][NV];
  int64_t row_offset[RB];  // rows past rb repeat the last one: computed, never stored
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r) {
    row_offset[r] = (kPartial && r >= rb ? rb - 1 : r) * a_row;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec<T>{};
  }
  for (int64_t q = 0; q < k; ++q) {
    Vec<T> brow[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) brow[v] = load(Bp + q * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const T a = A[row_offset[r] + q * a_col];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] += brow[v] * a;
    }
  }
  if (n == NV * W) {
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
      if (r < rb)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) store(C + r * n + v * W, acc[r][v]);
    return;
  }
  for (int r = 0; r < rb; ++r) {
    alignas(64) T row[NV * W];
    for (int v = 0; v < NV; ++v) store(row + v * W, acc[r][v]);
    for (int64_t j = 0; j < n; ++j) C[r * n + j] = row[j];
  }
}

// C = A * B for batch elements [begin, end), n <= NV * lanes, m, k <= kSmallMaxDim. B is
// read in place when its rows are whole vectors, else packed into a zero-padded block
// (that also absorbs transpose_b); RB rows of C share each B row load.
template <typename T, int NV>
void small_range(const BatchedMatmul<T>& p, int64_t begin, int64_t end) {
  constexpr int W = kLanes<T>;
  constexpr int NP = NV * W;
  constexpr int RB = kAccumulatorRegs / NV < 1 ? 1 : (kAccumulatorRegs / NV < 8 ? kAccumulatorRegs / NV : 8);
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool pack = p.transpose_b || n != NP;
  alignas(64) T packed[kSmallMaxDim * NP];
  for (int64_t j = 0; j < kSmallMaxDim * NP; ++j) packed[j] = T(0);
  const int64_t a_row = p.transpose_a ? 1 : k;  // stride between A(i, q) and A(i + 1, q)
  const int64_t a_col = p.transpose_a ? m : 1;  // stride between A(i, q) and A(i, q + 1)
  for (int64_t batch = begin; batch < end; ++batch) {
    const T* A = p.a + batch * m * k;
    const T* B = p.b + batch * k * n;
    T* C = p.c + batch * m * n;
    const T* Bp = B;
    int64_t ldb = n;
    if (pack) {  // columns past n stay zero from the initial fill
      if (p.transpose_b) {
        for (int64_t j = 0; j < n; ++j)
          for (int64_t q = 0; q < k; ++q) packed[q * NP + j] = B[j * k + q];
      } else {
        for (int64_t q = 0; q < k; ++q)
          for (int64_t j = 0; j < n; ++j) packed[q * NP + j] = B[q * n + j];
      }
      Bp = packed;
      ldb = NP;
    }
    int64_t i = 0;
    for (; i + RB <= m; i += RB)
      small_rows<T, NV, RB, false>(A + i * a_row, a_row, a_col, Bp, ldb, C + i * n, n, k, RB);
    if (i < m)
      small_rows<T, NV, RB, true>(A + i * a_row, a_row, a_col, Bp, ldb, C + i * n, n, k,
                                  static_cast<int>(m - i));
  }
}

constexpr int vectors_for(int columns, int lanes) { return (columns + lanes - 1) / lanes; }

// Size classes on n: <= 8, <= 16, <= 32 columns.
template <typename T>
void small_batched(const BatchedMatmul<T>& p, int64_t begin, int64_t end) {
  constexpr int W = kLanes<T>;
  if (p.n <= 8)
    small_range<T, vectors_for(8, W)>(p, begin, end);
  else if (p.n <= 16)
    small_range<T, vectors_for(16, W)>(p, begin, end);
  else
    small_range<T, vectors_for(32, W)>(p, begin, end);
}

// ------------------------------------------------------------------ matrix-vector

template <typename T>
void row_dots(const T* a, int64_t rows, int64_t cols, int64_t lda, const T* x, T* y) {
  constexpr int W = kLanes<T>;
  constexpr int RB = 4;
  // Short rows stream best one after the other; long rows four at a time (four prefetch
  // streams, and x is loaded once per four rows). Measured crossover: 1-4 KB rows.
  const bool by_four = cols * static_cast<int64_t>(sizeof(T)) > 2048;
  int64_t r = 0;
  for (; by_four && r + RB <= rows; r += RB) {
    Vec<T> acc[RB] = {};
    int64_t j = 0;
    for (; j + W <= cols; j += W) {
      const Vec<T> xv = load(x + j);
#pragma GCC unroll 4
      for (int i = 0; i < RB; ++i) acc[i] += load(a + (r + i) * lda + j) * xv;
    }
    for (int i = 0; i < RB; ++i) {
      T s = hsum<T>(acc[i]);
      for (int64_t t = j; t < cols; ++t) s += a[(r + i) * lda + t] * x[t];
      y[r + i] = s;
    }
  }
  for (; r < rows; ++r) {
    const T* row = a + r * lda;
    Vec<T> acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
    int64_t j = 0;
    for (; j + 4 * W <= cols; j += 4 * W) {
      acc0 += load(row + j) * load(x + j);
      acc1 += load(row + j + W) * load(x + j + W);
      acc2 += load(row + j + 2 * W) * load(x + j + 2 * W);
      acc3 += load(row + j + 3 * W) * load(x + j + 3 * W);
    }
    for (; j + W <= cols; j += W) acc0 += load(row + j) * load(x + j);
    T s = hsum<T>((acc0 + acc1) + (acc2 + acc3));
    for (; j < cols; ++j) s += row[j] * x[j];
    y[r] = s;
  }
}

template <typename T>
void row_axpys(const T* a, int64_t rows, int64_t cols, int64_t lda, const T* x, T* y) {
  constexpr int W = kLanes<T>;
  // y chunk stays in L1/L2 while whole row segments stream through (short strides, few TLB misses)
  constexpr int64_t kChunk = 32768 / sizeof(T) / W * W;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t width = cols - c0 < kChunk ? cols - c0 : kChunk;
    T* yc = y + c0;
    for (int64_t j = 0; j < width; ++j) yc[j] = T(0);
    int64_t r = 0;
    // as in row_dots: four rows at once only pays for long rows
    const bool by_four = width * static_cast<int64_t>(sizeof(T)) > 2048;
    for (; by_four && r + 4 <= rows; r += 4) {
      const T* a0 = a + r * lda + c0;
      const T x0 = x[r], x1 = x[r + 1], x2 = x[r + 2], x3 = x[r + 3];
      int64_t j = 0;
      for (; j + W <= width; j += W)
        store(yc + j, load(yc + j) + load(a0 + j) * x0 + load(a0 + lda + j) * x1 +
                          load(a0 + 2 * lda + j) * x2 + load(a0 + 3 * lda + j) * x3);
      for (; j < width; ++j)
        yc[j] += a0[j] * x0 + a0[lda + j] * x1 + a0[2 * lda + j] * x2 + a0[3 * lda + j] * x3;
    }
    for (; r < rows; ++r) {
      const T* a0 = a + r * lda + c0;
      const T x0 = x[r];
      int64_t j = 0;
      for (; j + W <= width; j += W) store(yc + j, load(yc + j) + load(a0 + j) * x0);
      for (; j < width; ++j) yc[j] += a0[j] * x0;
    }
  }
}

// ------------------------------------------------------------------ FMA throughput probe

template <typename T>
double fma_loop(int64_t iterations) {
  Vec<T> acc[kFmaChains];
#pragma GCC unroll 12
  for (int c = 0; c < kFmaChains; ++c) acc[c] = Vec<T>{} + T(c + 1) * T(1e-3);
  const Vec<T> scale = Vec<T>{} + T(0.999999);
  const Vec<T> shift = Vec<T>{} + T(1e-7);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int c = 0; c < kFmaChains; ++c) acc[c] = acc[c] * scale + shift;  // one FMA each
  }
  T sum = 0;
  for (int c = 0; c < kFmaChains; ++c) sum += hsum<T>(acc[c]);
  return static_cast<double>(sum);
}

// The table for this ISA: two register tiles (MR, NV vectors) and the fixed kernels.
template <int MR0, int NV0, int MR1, int NV1>
constexpr KernelTable make_table(const char* name) {
  return KernelTable{
      name,
      {GemmTile{MR0, NV0 * kLanes<float>, NV0 * kLanes<double>, &micro_kernel<float, MR0, NV0>,
                &micro_kernel<double, MR0, NV0>},
       GemmTile{MR1, NV1 * kLanes<float>, NV1 * kLanes<double>, &micro_kernel<float, MR1, NV1>,
                &micro_kernel<double, MR1, NV1>}},
      &small_batched<float>,
      &small_batched<double>,
      &row_dots<float>,
      &row_dots<double>,
      &row_axpys<float>,
      &row_axpys<double>,
      &fma_loop<float>,
      &fma_loop<double>,
      kVecBytes,
  };
}

}  // namespace
}  // namespace jat
