#include "gemm_driver.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "thread_pool.h"

namespace jat {
namespace {

constexpr int64_t kKc = 256;                   // depth of a packed panel
constexpr int64_t kMcBytes = 192 * 1024;       // packed A block: about half of L2
constexpr int64_t kNcBytes = 4 * 1024 * 1024;  // packed B panel: a share of L3
constexpr int64_t kSerialBatchFlops = 2 * 128 * 128 * 128;  // below: threads go over batch

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Per-thread, 64-byte aligned scratch that only grows: slot 0 packs A, slot 1 packs B.
template <typename T>
T* scratch(int slot, int64_t count) {
  thread_local std::unique_ptr<void, FreeDeleter> buffers[2];
  thread_local int64_t sizes[2] = {0, 0};
  const int64_t bytes = (count * static_cast<int64_t>(sizeof(T)) + 63) / 64 * 64;
  if (bytes > sizes[slot]) {
    buffers[slot].reset(std::aligned_alloc(64, bytes));
    sizes[slot] = bytes;
  }
  return static_cast<T*>(buffers[slot].get());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Packs rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into mr-row slivers (kc x mr each).
template <typename T>
void pack_a(const BatchedMatmul<T>& p, const T* a, int64_t i0, int64_t mc, int64_t p0,
            int64_t kc, int mr, T* dst) {
  for (int64_t s = 0; s * mr < mc; ++s) {
    T* out = dst + s * kc * mr;
    const int64_t row0 = i0 + s * mr;
    const int rows = static_cast<int>(std::min<int64_t>(mr, mc - s * mr));
    if (rows < mr) std::memset(out, 0, sizeof(T) * kc * mr);
    if (p.transpose_a) {  // A stored (k x m): a sliver row of op(A) is contiguous
      for (int64_t q = 0; q < kc; ++q) {
        const T* src = a + (p0 + q) * p.m + row0;
        for (int i = 0; i < rows; ++i) out[q * mr + i] = src[i];
      }
    } else {
      for (int i = 0; i < rows; ++i) {
        const T* src = a + (row0 + i) * p.k + p0;
        for (int64_t q = 0; q < kc; ++q) out[q * mr + i] = src[q];
      }
    }
  }
}

// Packs nr-column slivers [s0, s1) of depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B).
template <typename T>
void pack_b(const BatchedMatmul<T>& p, const T* b, int64_t j0, int64_t nc, int64_t p0,
            int64_t kc, int nr, int64_t s0, int64_t s1, T* dst) {
  for (int64_t s = s0; s < s1; ++s) {
    T* out = dst + s * kc * nr;
    const int64_t col0 = j0 + s * nr;
    const int cols = static_cast<int>(std::min<int64_t>(nr, nc - s * nr));
    if (cols < nr) std::memset(out, 0, sizeof(T) * kc * nr);
    if (p.transpose_b) {  // B stored (n x k)
      for (int j = 0; j < cols; ++j) {
        const T* src = b + (col0 + j) * p.k + p0;
        for (int64_t q = 0; q < kc; ++q) out[q * nr + j] = src[q];
      }
    } else {
      for (int64_t q = 0; q < kc; ++q)
        std::memcpy(out + q * nr, b + (p0 + q) * p.n + col0, sizeof(T) * cols);
    }
  }
}

template <typename T>
MicroKernelFn<T> micro_kernel_of(const GemmTile& tile);
template <>
MicroKernelFn<float> micro_kernel_of<float>(const GemmTile& tile) { return tile.f32; }
template <>
MicroKernelFn<double> micro_kernel_of<double>(const GemmTile& tile) { return tile.f64; }

template <typename T>
int nr_of(const GemmTile& tile) {
  return sizeof(T) == 4 ? tile.nr_f32 : tile.nr_f64;
}

// One matrix of the batch, on up to `threads` threads.
template <typename T>
void gemm_one(const BatchedMatmul<T>& p, int64_t batch, const GemmTile& tile, int threads) {
  const T* a = p.a + batch * p.m * p.k;
  const T* b = p.b + batch * p.k * p.n;
  T* c = p.c + batch * p.m * p.n;
  const int mr = tile.mr, nr = nr_of<T>(tile);
  const MicroKernelFn<T> kernel = micro_kernel_of<T>(tile);

  const int64_t kc_max = std::min(kKc, p.k);
  const int64_t nc_max = std::max<int64_t>(nr, kNcBytes / (kKc * sizeof(T)) / nr * nr);
  const int64_t mc_cap = std::max<int64_t>(mr, kMcBytes / (kKc * sizeof(T)) / mr * mr);
  // balanced M blocks: a multiple of `threads` blocks, each a multiple of mr rows
  int64_t m_blocks = ceil_div(p.m, mc_cap);
  m_blocks = ceil_div(m_blocks, threads) * threads;
  const int64_t mc = std::min(mc_cap, ceil_div(ceil_div(p.m, m_blocks), mr) * mr);
  m_blocks = ceil_div(p.m, mc);
  // too few M blocks for the threads: also split the N slivers of a panel into groups
  const int64_t n_groups = m_blocks >= threads ? 1 : ceil_div(threads, m_blocks);

  for (int64_t j0 = 0; j0 < p.n; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, p.n - j0);
    const int64_t slivers = ceil_div(nc, nr);
    T* b_packed = scratch<T>(1, slivers * kc_max * nr);
    for (int64_t p0 = 0; p0 < p.k; p0 += kKc) {
      const int64_t kc = std::min(kKc, p.k - p0);
      const int64_t pack_tasks = std::min<int64_t>(slivers, threads);
      parallel_for(pack_tasks, threads, [&](int64_t t) {
        pack_b(p, b, j0, nc, p0, kc, nr, slivers * t / pack_tasks,
               slivers * (t + 1) / pack_tasks, b_packed);
      });
      parallel_for(m_blocks * n_groups, threads, [&](int64_t task) {
        const int64_t i0 = (task / n_groups) * mc;
        const int64_t group = task % n_groups;
        const int64_t rows = std::min(mc, p.m - i0);
        T* a_packed = scratch<T>(0, ceil_div(rows, mr) * mr * kc);
        pack_a(p, a, i0, rows, p0, kc, mr, a_packed);
        for (int64_t s = slivers * group / n_groups; s < slivers * (group + 1) / n_groups; ++s) {
          const int64_t jr = s * nr;
          const int cols = static_cast<int>(std::min<int64_t>(nr, nc - jr));
          for (int64_t ir = 0; ir < rows; ir += mr) {
            kernel(kc, a_packed + (ir / mr) * kc * mr, b_packed + s * kc * nr,
                   c + (i0 + ir) * p.n + j0 + jr, p.n,
                   static_cast<int>(std::min<int64_t>(mr, rows - ir)), cols, p0 > 0);
          }
        }
      });
    }
  }
}

}  // namespace

template <typename T>
void gemm(const BatchedMatmul<T>& p, const GemmTile& tile, int threads) {
  threads = std::max(1, std::min(threads, available_threads()));
  const int64_t flops = 2 * p.m * p.n * p.k;
  if (threads > 1 && p.batch >= threads && flops <= kSerialBatchFlops) {
    parallel_for(threads, threads, [&](int64_t t) {
      for (int64_t b = p.batch * t / threads; b < p.batch * (t + 1) / threads; ++b)
        gemm_one(p, b, tile, 1);
    });
    return;
  }
  for (int64_t b = 0; b < p.batch; ++b) gemm_one(p, b, tile, threads);
}

template void gemm<float>(const BatchedMatmul<float>&, const GemmTile&, int);
template void gemm<double>(const BatchedMatmul<double>&, const GemmTile&, int);

}  // namespace jat
