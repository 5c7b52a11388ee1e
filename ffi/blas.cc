#include "blas.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace jat {
namespace {

// CBLAS enum values (cblas.h): row-major storage and the two transpose flags.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

template <typename T>
using CblasGemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, T alpha,
                           const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc);
using SetThreads = void (*)(int);

struct Blas {
  std::mutex mutex;
  std::string path;
  CblasGemm<float> sgemm = nullptr;
  CblasGemm<double> dgemm = nullptr;
  SetThreads set_threads = nullptr;
  std::atomic<int> threads{-1};  // last value given to set_threads
};

Blas& blas() {
  static Blas* instance = new Blas();  // never unloaded: kernels may hold its pointers
  return *instance;
}

}  // namespace

std::string load_blas(const std::string& path, const std::string& prefix) {
  Blas& b = blas();
  std::lock_guard<std::mutex> lock(b.mutex);
  if (!b.path.empty()) return "";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return std::string("dlopen failed: ") + dlerror();
  auto sgemm = reinterpret_cast<CblasGemm<float>>(dlsym(handle, (prefix + "cblas_sgemm").c_str()));
  auto dgemm = reinterpret_cast<CblasGemm<double>>(dlsym(handle, (prefix + "cblas_dgemm").c_str()));
  auto set_threads =
      reinterpret_cast<SetThreads>(dlsym(handle, (prefix + "openblas_set_num_threads").c_str()));
  if (sgemm == nullptr || dgemm == nullptr || set_threads == nullptr) {
    dlclose(handle);
    return "no " + prefix + "cblas_sgemm / " + prefix + "cblas_dgemm / " + prefix +
           "openblas_set_num_threads in " + path;
  }
  b.sgemm = sgemm;
  b.dgemm = dgemm;
  b.set_threads = set_threads;
  b.path = path;
  return "";
}

std::string blas_library() {
  Blas& b = blas();
  std::lock_guard<std::mutex> lock(b.mutex);
  return b.path;
}

template <typename T>
void blas_gemm(const BatchedMatmul<T>& p, int threads) {
  Blas& b = blas();
  if (b.threads.exchange(threads) != threads) b.set_threads(threads);
  CblasGemm<T> gemm;
  if constexpr (sizeof(T) == 4) gemm = b.sgemm; else gemm = b.dgemm;
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  for (int64_t i = 0; i < p.batch; ++i) {
    gemm(kRowMajor, p.transpose_a ? kTrans : kNoTrans, p.transpose_b ? kTrans : kNoTrans, m, n,
         k, T(1), p.a + i * p.m * p.k, p.transpose_a ? m : k, p.b + i * p.k * p.n,
         p.transpose_b ? k : n, T(0), p.c + i * p.m * p.n, n);
  }
}

template void blas_gemm<float>(const BatchedMatmul<float>&, int);
template void blas_gemm<double>(const BatchedMatmul<double>&, int);

}  // namespace jat
