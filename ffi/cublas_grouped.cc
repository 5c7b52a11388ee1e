// jax_autotune_cublas_grouped: a grouped matmul (lax.ragged_dot) by cuBLAS's
// cublasGemmGroupedBatchedEx on XLA's stream, one cuBLAS problem per non-empty group.
//
// ragged_k 0 (ragged m: the forward and the input gradient): lhs (m, k), rhs (groups, k, n),
// or (groups, n, k) when transpose_b, out (m, n); the rows of group g are lhs's rows of g
// times rhs[g], and rows past the last group are zero.
// ragged_k 1 (ragged k: the weight gradient): lhs (K, m) and rhs (K, n), the contraction
// first as the weight gradient stores them, out (groups, m, n): out[g] = lhs[rows of g].T @
// rhs[rows of g], zero for an empty group; transpose_b is 0. An empty contraction clears out.
//
// group_sizes: (groups,) int32 on the device; a group's rows are lax's (kernels/groups.py:
// the running sum clipped to the ragged rows). cuBLAS takes each problem's m, n and k on
// the host, so a call copies group_sizes back and waits for the stream: every call is a
// synchronization point of the host. The second result, a uint8 workspace of at least 3 x
// groups pointers, holds the device arrays of the problems' operand pointers. Attributes
// (int64): ragged_k, transpose_b (0 or 1), tf32 (f32 operands: 1 = TF32 tensor cores).
//
// Row-major C = A B is column-major C^T = B^T A^T: cuBLAS's "A" is our rhs, its "B" our lhs.
#include "cublas_grouped.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_loading.h"
#include "matmul_shapes.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jat {
namespace {

constexpr const char* kTarget = "jax_autotune_cublas_grouped";

using lt::kCompute32F, lt::kCompute32FFastTf32, lt::kOpN, lt::kOpT;  // cuBLAS's values (cublaslt_abi.h)
using Status = int;                    // cublasStatus_t and CUresult; 0 is success
using DevicePtr = unsigned long long;  // CUdeviceptr

struct Api {
  Status (*create)(void** handle);
  Status (*set_stream)(void* handle, void* stream);
  Status (*grouped)(void* handle, const int* transa, const int* transb, const int* m,
                    const int* n, const int* k, const void* alpha, const void* const* a,
                    int a_type, const int* lda, const void* const* b, int b_type,
                    const int* ldb, const void* beta, void* const* c, int c_type,
                    const int* ldc, int group_count, const int* group_size, int compute);
  Status (*to_host)(void* dst, DevicePtr src, size_t bytes, void* stream);
  Status (*to_device)(DevicePtr dst, const void* src, size_t bytes, void* stream);
  Status (*memset)(DevicePtr dst, unsigned char value, size_t bytes, void* stream);
  Status (*synchronize)(void* stream);
};

struct Library {
  std::mutex mutex;  // held for a whole call: the handle's stream is set per call
  std::string path;
  Api api{};
  std::map<int32_t, void*> handles;  // by device ordinal
};

Library& library() {
  static Library* instance = new Library();  // never unloaded: XLA may still call us
  return *instance;
}

ffi::Error failed(const char* call, Status status) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(kTarget) + ": " + call +
                                                   " failed with status " + std::to_string(status));
}

ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(kTarget) + ": " + what);
}

ffi::Error check_attributes(bool f32_in, int64_t ragged_k, int64_t transpose_b, int64_t tf32) {
  if (auto e = check_attribute(kTarget, "ragged_k", ragged_k, 0, 1, "0 or 1"); e.failure()) return e;
  if (auto e = check_attribute(kTarget, "transpose_b", transpose_b, 0, ragged_k == 1 ? 0 : 1,
                               ragged_k == 1 ? "0 with ragged_k 1" : "0 or 1");
      e.failure())
    return e;
  return check_attribute(kTarget, "tf32", tf32, 0, f32_in ? 1 : 0,
                         f32_in ? "0 or 1" : "0 (TF32 is for float32 operands)");
}

// The problem's sizes from the buffers' shapes: groups, the ragged rows, and m, n, k of
// each problem (k of a ragged-k problem is its group's).
struct Sizes {
  int64_t groups, rows, m, n, k;
};

ffi::Error check_buffers(const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                         const ffi::AnyBuffer& sizes, const ffi::AnyBuffer& out,
                         const ffi::AnyBuffer& workspace, bool ragged_k, bool tb, Sizes* s) {
  const ffi::DataType in = lhs.element_type(), result = out.element_type();
  if (cuda_type(in) < 0 || rhs.element_type() != in || result != in)  // no mixed output in cuBLAS's
    return invalid("lhs, rhs and out must be one dtype of bfloat16, float16, float32; got " +
                   std::string(dtype_name(in)) + ", " +
                   dtype_name(rhs.element_type()) + ", " + dtype_name(result));
  auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out.dimensions(), gd = sizes.dimensions();
  if (sizes.element_type() != ffi::DataType::S32 || gd.size() != 1)
    return invalid("group_sizes must be (groups,) int32, got " + dims_string(gd) + " " +
                   dtype_name(sizes.element_type()));
  const int64_t groups = gd[0];
  const std::string shapes = "lhs " + dims_string(ld) + ", rhs " + dims_string(rd) + ", out " +
                             dims_string(od) + ", group_sizes " + dims_string(gd);
  if (!ragged_k) {
    if (ld.size() != 2 || rd.size() != 3 || od.size() != 2 || rd[0] != groups ||
        (tb ? rd[2] : rd[1]) != ld[1] || od[0] != ld[0] || od[1] != (tb ? rd[1] : rd[2]))
      return invalid("ragged m takes lhs (m, k), rhs (groups, k, n) (or (groups, n, k) with "
                     "transpose_b) and out (m, n); got " + shapes);
    *s = Sizes{groups, ld[0], ld[0], od[1], ld[1]};
  } else {
    if (ld.size() != 2 || rd.size() != 2 || od.size() != 3 || rd[0] != ld[0] ||
        od[0] != groups || od[1] != ld[1] || od[2] != rd[1])
      return invalid("ragged k takes lhs (k, m), rhs (k, n) and out (groups, m, n); got " + shapes);
    *s = Sizes{groups, ld[0], ld[1], rd[1], ld[0]};
  }
  if (std::max({s->groups, s->rows, s->m, s->n, s->k}) > INT32_MAX)
    return invalid("every dimension must be below 2**31; got " + shapes);
  if (workspace.size_bytes() < static_cast<size_t>(3 * groups) * sizeof(void*))
    return invalid("the workspace must hold 3 x groups pointers, got " +
                   std::to_string(workspace.size_bytes()) + " bytes");
  return ffi::Error::Success();
}

// The problems cuBLAS runs (one per non-empty group) and the output bytes no problem writes.
struct Problems {
  std::vector<int> transa, transb, m, n, k, lda, ldb, ldc;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  std::vector<std::pair<size_t, size_t>> zero;  // (byte offset, bytes) of out to clear
};

Problems plan(const std::vector<int32_t>& group_sizes, const Sizes& s, bool ragged_k, bool tb,
              const char* lhs, const char* rhs, char* out, size_t in_bytes, size_t out_bytes) {
  Problems p;
  if (!ragged_k && s.k == 0) {  // an empty contraction: every row zero
    p.zero.emplace_back(0, s.m * s.n * out_bytes);
    return p;
  }
  int64_t total = 0, start = 0, covered = 0;  // covered: the rows some group reaches
  for (int64_t g = 0; g < s.groups; ++g) {
    total += group_sizes[g];
    const int64_t end = std::min(total, s.rows), rows = std::max<int64_t>(end - start, 0);
    if (rows > 0) {
      p.transa.push_back(ragged_k || !tb ? kOpN : kOpT);
      p.transb.push_back(ragged_k ? kOpT : kOpN);
      p.m.push_back(static_cast<int>(s.n));
      p.n.push_back(static_cast<int>(ragged_k ? s.m : rows));
      p.k.push_back(static_cast<int>(ragged_k ? rows : s.k));
      p.lda.push_back(static_cast<int>(ragged_k || !tb ? s.n : s.k));
      p.ldb.push_back(static_cast<int>(ragged_k ? s.m : s.k));
      p.ldc.push_back(static_cast<int>(s.n));
      if (ragged_k) {
        p.a.push_back(rhs + start * s.n * in_bytes);
        p.b.push_back(lhs + start * s.m * in_bytes);
        p.c.push_back(out + g * s.m * s.n * out_bytes);
      } else {
        p.a.push_back(rhs + g * s.k * s.n * in_bytes);
        p.b.push_back(lhs + start * s.k * in_bytes);
        p.c.push_back(out + start * s.n * out_bytes);
      }
    } else if (ragged_k) {
      p.zero.emplace_back(g * s.m * s.n * out_bytes, s.m * s.n * out_bytes);
    }
    start = end;
    covered = std::max(covered, end);
  }
  if (!ragged_k && covered < s.m)  // rows past the last group
    p.zero.emplace_back(covered * s.n * out_bytes, (s.m - covered) * s.n * out_bytes);
  return p;
}

ffi::Error grouped_impl(void* stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                        ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> workspace, int64_t ragged_k,
                        int64_t transpose_b, int64_t tf32) {
  const ffi::DataType in = lhs.element_type();
  if (auto e = check_attributes(in == ffi::DataType::F32, ragged_k, transpose_b, tf32); e.failure())
    return e;
  Sizes s;
  if (auto e = check_buffers(lhs, rhs, group_sizes, *out, *workspace, ragged_k, transpose_b, &s);
      e.failure())
    return e;
  if (out->size_bytes() == 0) return ffi::Error::Success();
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (lib.path.empty())
    return ffi::Error(ffi::ErrorCode::kUnavailable,
                      std::string(kTarget) + ": cuBLAS is not loaded (cublas_grouped.available())");
  const Api& api = lib.api;
  void*& handle = lib.handles[device];
  if (handle == nullptr)
    if (Status st = api.create(&handle); st != 0) {
      handle = nullptr;
      return failed("cublasCreate", st);
    }
  std::vector<int32_t> sizes(s.groups);
  Status st;
  if (s.groups > 0 &&
      ((st = api.to_host(sizes.data(), reinterpret_cast<DevicePtr>(group_sizes.untyped_data()),
                         s.groups * sizeof(int32_t), stream)) ||
       (st = api.synchronize(stream))))
    return failed("copying group_sizes to the host", st);
  const size_t in_bytes = ffi::ByteWidth(in), out_bytes = ffi::ByteWidth(out->element_type());
  Problems p = plan(sizes, s, ragged_k, transpose_b, static_cast<const char*>(lhs.untyped_data()),
                    static_cast<const char*>(rhs.untyped_data()),
                    static_cast<char*>(out->untyped_data()), in_bytes, out_bytes);
  const DevicePtr out_base = reinterpret_cast<DevicePtr>(out->untyped_data());
  for (const auto& [offset, bytes] : p.zero)
    if ((st = api.memset(out_base + offset, 0, bytes, stream))) return failed("cuMemsetD8Async", st);
  const int count = static_cast<int>(p.a.size());
  if (count == 0) return ffi::Error::Success();
  // the pointer arrays on the device, a | b | c; a pageable source is staged before the copy returns
  std::vector<const void*> pointers(p.a);
  pointers.insert(pointers.end(), p.b.begin(), p.b.end());
  pointers.insert(pointers.end(), p.c.begin(), p.c.end());
  const DevicePtr arrays = reinterpret_cast<DevicePtr>(workspace->untyped_data());
  if ((st = api.to_device(arrays, pointers.data(), pointers.size() * sizeof(void*), stream)))
    return failed("copying the operand pointers to the device", st);
  const auto* device_a = reinterpret_cast<const void* const*>(arrays);
  const auto* device_b = device_a + count;
  auto* device_c = reinterpret_cast<void* const*>(arrays + 2 * count * sizeof(void*));
  const std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  const std::vector<int> ones(count, 1);
  const int compute = in == ffi::DataType::F32 && tf32 ? kCompute32FFastTf32 : kCompute32F;
  if ((st = api.set_stream(handle, stream))) return failed("cublasSetStream", st);
  st = api.grouped(handle, p.transa.data(), p.transb.data(), p.m.data(), p.n.data(), p.k.data(),
                   alpha.data(), device_a, cuda_type(in), p.lda.data(), device_b, cuda_type(in),
                   p.ldb.data(), beta.data(), device_c, cuda_type(out->element_type()),
                   p.ldc.data(), count, ones.data(), compute);
  if (st != 0) return failed("cublasGemmGroupedBatchedEx", st);
  return ffi::Error::Success();
}

}  // namespace

std::string cublas_grouped_attribute_error(bool f32_operands, int64_t ragged_k, int64_t transpose_b,
                                           int64_t tf32) {
  return check_attributes(f32_operands, ragged_k, transpose_b, tf32).message();
}

std::string load_cublas_grouped(const std::string& cublas_path, const std::string& driver_path) {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (!lib.path.empty()) return "";
  void* cublas = dlopen(cublas_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (cublas == nullptr) return std::string("dlopen failed: ") + dlerror();
  void* driver = dlopen(driver_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  const std::string driver_error = driver ? "" : std::string("dlopen failed: ") + dlerror();
  auto fail = [&](const std::string& why) {  // neither library stays open
    dlclose(cublas);
    if (driver != nullptr) dlclose(driver);
    return why;
  };
  if (driver == nullptr) return fail(driver_error);
  Api api{};
  if (!(resolve(cublas, "cublasCreate_v2", &api.create) &&
        resolve(cublas, "cublasSetStream_v2", &api.set_stream) &&
        resolve(cublas, "cublasGemmGroupedBatchedEx", &api.grouped)))
    return fail("not a cuBLAS with a grouped GEMM (12.5 or newer): " + cublas_path);
  if (!(resolve(driver, "cuMemcpyDtoHAsync_v2", &api.to_host) &&
        resolve(driver, "cuMemcpyHtoDAsync_v2", &api.to_device) &&
        resolve(driver, "cuMemsetD8Async", &api.memset) &&
        resolve(driver, "cuStreamSynchronize", &api.synchronize)))
    return fail("not a CUDA driver library (a cu* entry point is missing): " + driver_path);
  lib.api = api;
  lib.path = cublas_path;
  return "";
}

std::string cublas_grouped_library() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return lib.path;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CublasGroupedHandler, grouped_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("ragged_k")
                                  .Attr<int64_t>("transpose_b")
                                  .Attr<int64_t>("tf32"));

std::vector<std::pair<const char*, XLA_FFI_Handler*>> cublas_grouped_handlers() {
  return {{kTarget, CublasGroupedHandler}};
}

}  // namespace jat
