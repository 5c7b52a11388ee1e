// FFI handlers: decode and check buffers and attributes, then call the kernels.
//
// Every matmul target takes lhs (batch, m, k) or (batch, k, m) when transpose_a, rhs
// (batch, k, n) or (batch, n, k) when transpose_b, returns (batch, m, n), all of one
// dtype (f32 or f64), and the int64 attributes transpose_a, transpose_b (0 or 1), threads
// (0 = all, else at most kMaxThreadsAttribute), isa (not for BLAS) and tile (GEMM only).
// Every attribute is checked before anything runs: a value out of range (an edited
// artifact) is an InvalidArgument error, never a cast that wraps or an output left unwritten.
#include "handlers.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "blas.h"
#include "gemm_driver.h"
#include "isa.h"
#include "kernel_table.h"
#include "matmul_shapes.h"
#include "thread_pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jat {
namespace {

// Checks the attributes every target has, and that lhs, rhs and out are one canonical
// matmul of one dtype, f32 or f64.
ffi::Error check_matmul(const char* target, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                        const ffi::AnyBuffer& out, int64_t ta, int64_t tb, int64_t threads,
                        Shapes* shapes) {
  if (auto e = check_attribute(target, "transpose_a", ta, 0, 1, "0 or 1"); e.failure()) return e;
  if (auto e = check_attribute(target, "transpose_b", tb, 0, 1, "0 or 1"); e.failure()) return e;
  if (auto e = check_attribute(target, "threads", threads, 0, kMaxThreadsAttribute,
                               ("0 (all) or 1 to " + std::to_string(kMaxThreadsAttribute)).c_str());
      e.failure())
    return e;
  if (auto e = check_shapes(target, lhs, rhs, out, ta != 0, tb != 0, shapes); e.failure()) return e;
  const std::string where = std::string(target) + ": ";
  const ffi::DataType t = lhs.element_type();
  if (t != ffi::DataType::F32 && t != ffi::DataType::F64)
    return ffi::Error::InvalidArgument(where + "lhs dtype must be float32 or float64, got " +
                                       dtype_name(t));
  if (rhs.element_type() != t || out.element_type() != t)
    return ffi::Error::InvalidArgument(where + "lhs, rhs and out must share one dtype; got " +
                                       dtype_name(t) + ", " + dtype_name(rhs.element_type()) +
                                       ", " + dtype_name(out.element_type()));
  return ffi::Error::Success();
}

// An empty contraction (k == 0) is all zeros; the kernels assume k >= 1. True when handled.
bool handled_empty(const Shapes& s, ffi::AnyBuffer out) {
  if (s.batch * s.m * s.n * s.k != 0) return false;
  std::memset(out.untyped_data(), 0, out.size_bytes());
  return true;
}

ffi::Error check_isa(const char* target, int64_t isa) {
  const Isa effective = isa_choice().effective;
  if (auto e = check_attribute(target, "isa", isa, 0, kIsaCount - 1,
                               "0 (portable), 1 (avx2) or 2 (avx512)");
      e.failure())
    return e;
  if (isa > static_cast<int64_t>(effective))
    return ffi::Error(ffi::ErrorCode::kUnavailable,
                      std::string(target) + ": isa " + isa_name(static_cast<Isa>(isa)) +
                          " is not available here (effective ISA: " + isa_name(effective) + ")");
  return ffi::Error::Success();
}

// `threads` as checked by check_matmul: 0 = all; never more than are here.
int thread_count(int64_t threads) {
  const int here = available_threads();
  return threads == 0 ? here : static_cast<int>(std::min<int64_t>(threads, here));
}

template <typename T>
BatchedMatmul<T> batched(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer out,
                         const Shapes& s, bool ta, bool tb) {
  return BatchedMatmul<T>{static_cast<const T*>(lhs.untyped_data()),
                          static_cast<const T*>(rhs.untyped_data()),
                          static_cast<T*>(out.untyped_data()), s.batch, s.m, s.n, s.k, ta, tb};
}

// Calls run(BatchedMatmul<float or double>) for the operands' element type (checked to be
// f32 or f64, and equal, by check_matmul).
template <typename Run>
void with_batched(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::AnyBuffer out, const Shapes& s,
                  bool ta, bool tb, Run run) {
  if (lhs.element_type() == ffi::DataType::F32)
    run(batched<float>(lhs, rhs, out, s, ta, tb));
  else
    run(batched<double>(lhs, rhs, out, s, ta, tb));
}

// Runs body(batch_range_begin, batch_range_end) over `threads` contiguous batch chunks.
template <typename Body>
void over_batch(int64_t batch, int threads, Body body) {
  const int64_t chunks = std::min<int64_t>(batch, threads);
  parallel_for(chunks, threads,
               [&](int64_t t) { body(batch * t / chunks, batch * (t + 1) / chunks); });
}

// ---------------------------------------------------------------- noop

ffi::Error noop_impl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  if (x.element_count() < 1 || out->element_count() != 1 ||
      x.element_type() != out->element_type())
    return ffi::Error::InvalidArgument(
        "jax_autotune_noop: expected a non-empty input and a one-element output of its dtype");
  std::memcpy(out->untyped_data(), x.untyped_data(), out->size_bytes());
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- small matmuls

template <typename T>
void run_small(const BatchedMatmul<T>& p, const KernelTable& table, int threads) {
  SmallFn<T> fn;
  if constexpr (sizeof(T) == 4) fn = table.small_f32; else fn = table.small_f64;
  // a thread costs ~10 us to wake; give each at least ~64k flops of work
  const int64_t useful = std::max<int64_t>(1, p.batch * p.m * p.n * p.k / 32768);
  over_batch(p.batch, static_cast<int>(std::min<int64_t>(threads, useful)),
             [&](int64_t b0, int64_t b1) { fn(p, b0, b1); });
}

ffi::Error small_impl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                      int64_t transpose_a, int64_t transpose_b, int64_t isa, int64_t threads) {
  const char* target = "jax_autotune_small";
  Shapes s;
  if (auto e = check_matmul(target, lhs, rhs, *out, transpose_a, transpose_b, threads, &s);
      e.failure())
    return e;
  if (auto e = check_isa(target, isa); e.failure()) return e;
  if (handled_empty(s, *out)) return ffi::Error::Success();
  if (s.m > kSmallMaxDim || s.n > kSmallMaxDim || s.k > kSmallMaxDim)
    return ffi::Error::InvalidArgument(std::string(target) + ": m, n and k must be <= " +
                                       std::to_string(kSmallMaxDim) + ", got m=" +
                                       std::to_string(s.m) + " n=" + std::to_string(s.n) +
                                       " k=" + std::to_string(s.k));
  const KernelTable& table = kernels_for(static_cast<Isa>(isa));
  with_batched(lhs, rhs, *out, s, transpose_a, transpose_b,
               [&](const auto& p) { run_small(p, table, thread_count(threads)); });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- matrix-vector

// MatVec (n == 1): y = op(A) x; VecMat (m == 1): y = x op(B). Each is either one dot per
// output element (the matrix's rows run along k) or a sum of scaled rows (they run along
// the output), picked by the stored layout.
template <typename T>
void run_gemv(const BatchedMatmul<T>& p, const KernelTable& table, int threads) {
  RowDotsFn<T> dots;
  RowAxpysFn<T> axpys;
  if constexpr (sizeof(T) == 4) {
    dots = table.row_dots_f32;
    axpys = table.row_axpys_f32;
  } else {
    dots = table.row_dots_f64;
    axpys = table.row_axpys_f64;
  }
  const bool mat_vec = p.n == 1;
  const int64_t outputs = mat_vec ? p.m : p.n;
  // MatVec reads A as (m x k) rows unless transposed; VecMat reads B as (n x k) rows if transposed
  const bool by_dots = mat_vec ? !p.transpose_a : p.transpose_b;
  auto one = [&](int64_t b, int64_t o0, int64_t o1) {
    const T* matrix = mat_vec ? p.a + b * p.m * p.k : p.b + b * p.k * p.n;
    const T* vector = mat_vec ? p.b + b * p.k : p.a + b * p.k;
    T* y = p.c + b * outputs;
    if (by_dots)
      dots(matrix + o0 * p.k, o1 - o0, p.k, p.k, vector, y + o0);
    else
      axpys(matrix + o0, p.k, o1 - o0, outputs, vector, y + o0);
  };
  const int64_t useful = std::max<int64_t>(1, p.batch * outputs * p.k / 32768);
  threads = static_cast<int>(std::min<int64_t>(threads, useful));
  if (p.batch >= threads) {
    over_batch(p.batch, threads, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) one(b, 0, outputs);
    });
    return;
  }
  // few long vectors: split the outputs, in chunks that keep vector alignment
  const int64_t chunk = std::max<int64_t>(64, (outputs / threads + 63) / 64 * 64);
  const int64_t chunks = (outputs + chunk - 1) / chunk;
  for (int64_t b = 0; b < p.batch; ++b)
    parallel_for(chunks, threads, [&](int64_t t) {
      one(b, t * chunk, std::min(outputs, (t + 1) * chunk));
    });
}

ffi::Error gemv_impl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                     int64_t transpose_a, int64_t transpose_b, int64_t isa, int64_t threads) {
  const char* target = "jax_autotune_gemv";
  Shapes s;
  if (auto e = check_matmul(target, lhs, rhs, *out, transpose_a, transpose_b, threads, &s);
      e.failure())
    return e;
  if (auto e = check_isa(target, isa); e.failure()) return e;
  if (handled_empty(s, *out)) return ffi::Error::Success();
  if (s.n != 1 && s.m != 1)
    return ffi::Error::InvalidArgument(std::string(target) + ": needs n == 1 (MatVec) or "
                                       "m == 1 (VecMat), got m=" + std::to_string(s.m) +
                                       " n=" + std::to_string(s.n));
  const KernelTable& table = kernels_for(static_cast<Isa>(isa));
  with_batched(lhs, rhs, *out, s, transpose_a, transpose_b,
               [&](const auto& p) { run_gemv(p, table, thread_count(threads)); });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- packed GEMM

ffi::Error gemm_impl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                     int64_t transpose_a, int64_t transpose_b, int64_t isa, int64_t threads,
                     int64_t tile) {
  const char* target = "jax_autotune_gemm";
  Shapes s;
  if (auto e = check_matmul(target, lhs, rhs, *out, transpose_a, transpose_b, threads, &s);
      e.failure())
    return e;
  if (auto e = check_isa(target, isa); e.failure()) return e;
  if (auto e = check_attribute(target, "tile", tile, 0, kTilesPerIsa - 1,
                               ("a tile index in [0, " + std::to_string(kTilesPerIsa) + ")").c_str());
      e.failure())
    return e;
  if (handled_empty(s, *out)) return ffi::Error::Success();
  const GemmTile& t = kernels_for(static_cast<Isa>(isa)).tiles[tile];
  with_batched(lhs, rhs, *out, s, transpose_a, transpose_b,
               [&](const auto& p) { gemm(p, t, thread_count(threads)); });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- BLAS (optional)

ffi::Error blas_impl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                     int64_t transpose_a, int64_t transpose_b, int64_t threads) {
  const char* target = "jax_autotune_blas";
  Shapes s;
  if (auto e = check_matmul(target, lhs, rhs, *out, transpose_a, transpose_b, threads, &s);
      e.failure())
    return e;
  if (blas_library().empty())
    return ffi::Error(ffi::ErrorCode::kUnavailable,
                      std::string(target) + ": no BLAS library is loaded (native.blas_available())");
  constexpr int64_t kMaxBlasInt = 2147483647;
  if (s.m > kMaxBlasInt || s.n > kMaxBlasInt || s.k > kMaxBlasInt)
    return ffi::Error::InvalidArgument(std::string(target) + ": m, n and k must fit a 32-bit "
                                       "BLAS int");
  if (handled_empty(s, *out)) return ffi::Error::Success();
  with_batched(lhs, rhs, *out, s, transpose_a, transpose_b,
               [&](const auto& p) { blas_gemm(p, thread_count(threads)); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NoopHandler, noop_impl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

#define JAT_MATMUL_BINDING                                    \
  ffi::Ffi::Bind()                                            \
      .Arg<ffi::AnyBuffer>()                                  \
      .Arg<ffi::AnyBuffer>()                                  \
      .Ret<ffi::AnyBuffer>()                                  \
      .Attr<int64_t>("transpose_a")                           \
      .Attr<int64_t>("transpose_b")                           \
      .Attr<int64_t>("isa")                                   \
      .Attr<int64_t>("threads")

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallHandler, small_impl, JAT_MATMUL_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvHandler, gemv_impl, JAT_MATMUL_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(GemmHandler, gemm_impl, JAT_MATMUL_BINDING.Attr<int64_t>("tile"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BlasHandler, blas_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("transpose_a")
                                  .Attr<int64_t>("transpose_b")
                                  .Attr<int64_t>("threads"));

std::vector<std::pair<const char*, XLA_FFI_Handler*>> ffi_handlers() {
  return {
      {"jax_autotune_noop", NoopHandler},
      {"jax_autotune_small", SmallHandler},
      {"jax_autotune_gemv", GemvHandler},
      {"jax_autotune_gemm", GemmHandler},
      {"jax_autotune_blas", BlasHandler},
  };
}

}  // namespace jat
