// jax_autotune_cublaslt: out = lhs @ rhs by cublasLtMatmul with the `algorithm`-th of the
// algorithms cuBLASLt's heuristic offers for the problem (the last one when it offers
// fewer), on XLA's stream. Operands are the canonical ones (matmul_shapes.h) in bf16, f16
// or f32; out is the operands' dtype or f32 (f32 operands: f32 only). Attributes (int64):
// transpose_a, transpose_b (0 or 1), tf32 (f32 operands: 1 = TF32 tensor cores, 0 = full
// f32; other operands: 0), algorithm (0 to kMaxAlgorithms - 1), each checked before
// anything runs. A second result, a uint8 buffer, is the workspace.
//
// Row-major C = A B is column-major C^T = B^T A^T, so cuBLASLt's "A" is our rhs and its
// "B" our lhs; a transposed operand is read in place (op T).
//
// jax_autotune_cublaslt_epilogue: the same with cuBLASLt's epilogue, out = act(lhs @ rhs +
// residual + bias), in one kernel. Two more operands, bias (n,) and residual (batch, m, n),
// both in out's dtype (a one-element placeholder where unused), and three more attributes:
// activation (0 none, 1 relu, 2 gelu, cuBLASLt's tanh form), has_bias, has_residual (0 or
// 1); a residual takes no activation (cuBLASLt would apply it after the residual).
#include "cublaslt.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "cublaslt_abi.h"
#include "cuda_loading.h"
#include "matmul_shapes.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jat {
namespace {

using namespace lt;  // NOLINT: the cuBLASLt declarations

constexpr int kMaxAlgorithms = kCublasLtMaxAlgorithms;  // asked of the heuristic per problem


struct Api {
  Status (*create)(LtHandle*);
  Status (*desc_create)(MatmulDesc*, int compute, int scale);
  Status (*desc_set)(MatmulDesc, int attribute, const void*, size_t);
  Status (*layout_create)(MatrixLayout*, int type, uint64_t rows, uint64_t cols, int64_t ld);
  Status (*layout_set)(MatrixLayout, int attribute, const void*, size_t);
  Status (*preference_create)(Preference*);
  Status (*preference_set)(Preference, int attribute, const void*, size_t);
  Status (*preference_destroy)(Preference);
  Status (*heuristic)(LtHandle, MatmulDesc, MatrixLayout, MatrixLayout, MatrixLayout,
                      MatrixLayout, Preference, int requested, HeuristicResult*, int* returned);
  Status (*matmul)(LtHandle, MatmulDesc, const void* alpha, const void* a, MatrixLayout,
                   const void* b, MatrixLayout, const void* beta, const void* c, MatrixLayout,
                   void* d, MatrixLayout, const Algo*, void* workspace, size_t workspace_bytes,
                   void* stream);
  size_t (*version)();
};

// One problem's descriptors and algorithms, made on its first call and kept (read-only
// after that, so calls share them without the lock; a bias pointer, set per call, takes
// the plan's own lock).
struct Plan {
  MatmulDesc desc = nullptr;
  MatrixLayout a = nullptr, b = nullptr, c = nullptr;
  std::vector<Algo> algorithms;
  std::mutex bias_mutex;
};

// device, in, out, compute types, batch, m, n, k, transposes, alignments of lhs, rhs,
// out, workspace bytes, cuBLASLt epilogue, alignments of the bias and of C (the residual)
using PlanKey = std::tuple<int32_t, int, int, int, int64_t, int64_t, int64_t, int64_t, bool,
                           bool, uint32_t, uint32_t, uint32_t, size_t, uint32_t, uint32_t,
                           uint32_t>;

// What a call applies after the product: cuBLASLt's epilogue, its bias and C (beta 1).
struct Epilogue {
  uint32_t code = kEpilogueDefault;
  const void* bias = nullptr;
  const void* residual = nullptr;
};

struct Library {
  std::mutex mutex;
  std::string path;
  Api api{};
  std::map<int32_t, LtHandle> handles;  // by device ordinal
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

Library& library() {
  static Library* instance = new Library();  // never unloaded: XLA may still call us
  return *instance;
}

std::string status_error(const char* call, Status status) {
  return std::string("jax_autotune_cublaslt: ") + call + " failed with cublasStatus_t " +
         std::to_string(status);
}

uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// Descriptors and heuristic algorithms for `key`; `error` says why when it returns null.
// Called with the library's lock held.
Plan* make_plan(Library& lib, LtHandle handle, const PlanKey& key, std::string* error) {
  const auto& [device, in_type, out_type, compute, batch, m, n, k, ta, tb, align_lhs,
               align_rhs, align_out, workspace, epilogue, align_bias, align_c] = key;
  const Api& api = lib.api;
  auto plan = std::make_unique<Plan>();
  auto fail = [&](const char* call, Status s) {
    *error = status_error(call, s);
    return nullptr;
  };
  Status s;
  if ((s = api.desc_create(&plan->desc, compute, kR32F))) return fail("MatmulDescCreate", s);
  const int op_a = tb ? kOpT : kOpN, op_b = ta ? kOpT : kOpN;
  if ((s = api.desc_set(plan->desc, kDescTransA, &op_a, sizeof(op_a))) ||
      (s = api.desc_set(plan->desc, kDescTransB, &op_b, sizeof(op_b))) ||
      (epilogue != kEpilogueDefault &&
       (s = api.desc_set(plan->desc, kDescEpilogue, &epilogue, sizeof(epilogue)))))
    return fail("MatmulDescSetAttribute", s);
  if (align_bias != 0) {  // the heuristic reads the bias pointer's alignment: one with it
    const void* aligned = reinterpret_cast<const void*>(static_cast<uintptr_t>(align_bias));
    if ((s = api.desc_set(plan->desc, kDescBiasPointer, &aligned, sizeof(aligned))))
      return fail("MatmulDescSetAttribute", s);
  }
  // cuBLASLt's A is our rhs: column-major (n x k), or (k x n) read transposed
  if ((s = api.layout_create(&plan->a, in_type, tb ? k : n, tb ? n : k, tb ? k : n)) ||
      (s = api.layout_create(&plan->b, in_type, ta ? m : k, ta ? k : m, ta ? m : k)) ||
      (s = api.layout_create(&plan->c, out_type, n, m, n)))
    return fail("MatrixLayoutCreate", s);
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    const int64_t strides[3] = {n * k, m * k, m * n};
    MatrixLayout layouts[3] = {plan->a, plan->b, plan->c};
    for (int i = 0; i < 3; ++i)
      if ((s = api.layout_set(layouts[i], kLayoutBatchCount, &count, sizeof(count))) ||
          (s = api.layout_set(layouts[i], kLayoutBatchStride, &strides[i], sizeof(strides[i]))))
        return fail("MatrixLayoutSetAttribute", s);
  }
  Preference preference = nullptr;
  if ((s = api.preference_create(&preference))) return fail("MatmulPreferenceCreate", s);
  const uint64_t max_workspace = workspace;
  const uint32_t aligns[4] = {align_rhs, align_lhs, align_c, align_out};
  const int align_attributes[4] = {kPrefAlignA, kPrefAlignB, kPrefAlignC, kPrefAlignD};
  s = api.preference_set(preference, kPrefMaxWorkspace, &max_workspace, sizeof(max_workspace));
  for (int i = 0; i < 4 && s == 0; ++i)
    s = api.preference_set(preference, align_attributes[i], &aligns[i], sizeof(aligns[i]));
  HeuristicResult results[kMaxAlgorithms] = {};
  int returned = 0;
  if (s == 0)
    s = api.heuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c, preference,
                      kMaxAlgorithms, results, &returned);
  api.preference_destroy(preference);
  if (s) return fail("MatmulAlgoGetHeuristic", s);
  for (int i = 0; i < returned; ++i)
    if (results[i].state == 0 && results[i].workspace_size <= workspace)
      plan->algorithms.push_back(results[i].algo);
  if (plan->algorithms.empty()) {
    *error = "jax_autotune_cublaslt: cuBLASLt offers no algorithm for batch " +
             std::to_string(batch) + ", m " + std::to_string(m) + ", n " + std::to_string(n) +
             ", k " + std::to_string(k);
    return nullptr;
  }
  Plan* raw = plan.get();
  lib.plans.emplace(key, std::move(plan));
  return raw;
}

ffi::Error check_attributes(const char* target, bool f32_in, int64_t transpose_a,
                            int64_t transpose_b, int64_t tf32, int64_t algorithm) {
  if (auto e = check_attribute(target, "transpose_a", transpose_a, 0, 1, "0 or 1"); e.failure())
    return e;
  if (auto e = check_attribute(target, "transpose_b", transpose_b, 0, 1, "0 or 1"); e.failure())
    return e;
  if (auto e = check_attribute(target, "tf32", tf32, 0, f32_in ? 1 : 0,
                               f32_in ? "0 or 1" : "0 (TF32 is for float32 operands)");
      e.failure())
    return e;
  return check_attribute(target, "algorithm", algorithm, 0, kMaxAlgorithms - 1,
                         ("0 to " + std::to_string(kMaxAlgorithms - 1)).c_str());
}

ffi::Error check_epilogue_attributes(int64_t activation, int64_t has_bias, int64_t has_residual) {
  const char* target = "jax_autotune_cublaslt_epilogue";
  if (auto e = check_attribute(target, "has_bias", has_bias, 0, 1, "0 or 1"); e.failure()) return e;
  if (auto e = check_attribute(target, "has_residual", has_residual, 0, 1, "0 or 1"); e.failure())
    return e;
  return check_attribute(target, "activation", activation, 0, has_residual == 1 ? 0 : 2,
                         has_residual == 1 ? "0 (none) with a residual" : "0 (none), 1 (relu) or 2 (gelu)");
}

// The matmul of both targets, their attributes already checked.
ffi::Error run_matmul(const char* target, void* stream, int32_t device, ffi::AnyBuffer lhs,
                      ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                      ffi::Result<ffi::AnyBuffer> workspace, int64_t transpose_a,
                      int64_t transpose_b, int64_t tf32, int64_t algorithm,
                      const Epilogue& epilogue) {
  Shapes s;
  if (auto e = check_shapes(target, lhs, rhs, *out, transpose_a != 0, transpose_b != 0, &s);
      e.failure())
    return e;
  const ffi::DataType in = lhs.element_type(), result = out->element_type();
  if (cuda_type(in) < 0 || rhs.element_type() != in ||
      (result != in && result != ffi::DataType::F32))
    return ffi::Error::InvalidArgument(
        std::string(target) + ": lhs and rhs must be one of bfloat16, float16, float32 and out "
        "theirs or float32; got " + dtype_name(in) + ", " + dtype_name(rhs.element_type()) +
        ", " + dtype_name(result));
  if (s.batch * s.m * s.n == 0) return ffi::Error::Success();
  if (s.k == 0 || s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX || s.batch > INT32_MAX)
    return ffi::Error::InvalidArgument(std::string(target) + ": needs 1 <= k and every "
                                       "dimension below 2**31 (the wrapper handles k == 0)");
  Library& lib = library();
  Plan* plan = nullptr;
  LtHandle handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(lib.mutex);
    if (lib.path.empty())
      return ffi::Error(ffi::ErrorCode::kUnavailable,
                        std::string(target) + ": cuBLASLt is not loaded (cublaslt.available())");
    LtHandle& slot = lib.handles[device];
    if (slot == nullptr)
      if (Status st = lib.api.create(&slot); st != 0) {
        slot = nullptr;
        return ffi::Error(ffi::ErrorCode::kInternal, status_error("cublasLtCreate", st));
      }
    handle = slot;
    const int compute = in == ffi::DataType::F32 && tf32 != 0 ? kCompute32FFastTf32 : kCompute32F;
    const uint32_t align_out = alignment(out->untyped_data());
    const PlanKey key{device, cuda_type(in), cuda_type(result), compute, s.batch, s.m, s.n, s.k,
                      transpose_a != 0, transpose_b != 0, alignment(lhs.untyped_data()),
                      alignment(rhs.untyped_data()), align_out, workspace->size_bytes(),
                      epilogue.code, epilogue.bias ? alignment(epilogue.bias) : 0u,
                      epilogue.residual ? alignment(epilogue.residual) : align_out};
    auto found = lib.plans.find(key);
    if (found != lib.plans.end()) {
      plan = found->second.get();
    } else {
      std::string error;
      plan = make_plan(lib, handle, key, &error);
      if (plan == nullptr) return ffi::Error(ffi::ErrorCode::kInternal, error);
    }
  }
  const size_t pick = std::min<size_t>(algorithm, plan->algorithms.size() - 1);
  const float alpha = 1.0f, beta = epilogue.residual ? 1.0f : 0.0f;
  const void* c = epilogue.residual ? epilogue.residual : out->untyped_data();
  auto call = [&]() {
    return lib.api.matmul(handle, plan->desc, &alpha, rhs.untyped_data(), plan->a,
                          lhs.untyped_data(), plan->b, &beta, c, plan->c, out->untyped_data(),
                          plan->c, &plan->algorithms[pick], workspace->untyped_data(),
                          workspace->size_bytes(), stream);
  };
  Status st;
  if (epilogue.bias != nullptr) {
    std::lock_guard<std::mutex> lock(plan->bias_mutex);  // the pointer lives in the plan's descriptor
    st = lib.api.desc_set(plan->desc, kDescBiasPointer, &epilogue.bias, sizeof(epilogue.bias));
    if (st == 0) st = call();
  } else {
    st = call();
  }
  if (st != 0) return ffi::Error(ffi::ErrorCode::kInternal, status_error("cublasLtMatmul", st));
  return ffi::Error::Success();
}

ffi::Error cublaslt_impl(void* stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                         int64_t transpose_a, int64_t transpose_b, int64_t tf32,
                         int64_t algorithm) {
  const char* target = "jax_autotune_cublaslt";
  const bool f32_in = lhs.element_type() == ffi::DataType::F32;
  if (auto e = check_attributes(target, f32_in, transpose_a, transpose_b, tf32, algorithm); e.failure())
    return e;
  return run_matmul(target, stream, device, lhs, rhs, out, workspace, transpose_a, transpose_b,
                    tf32, algorithm, Epilogue{});
}

// The epilogue variant: bias and residual checked against out, then the same matmul.
ffi::Error cublaslt_epilogue_impl(void* stream, int32_t device, ffi::AnyBuffer lhs,
                                  ffi::AnyBuffer rhs, ffi::AnyBuffer bias,
                                  ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> workspace, int64_t transpose_a,
                                  int64_t transpose_b, int64_t tf32, int64_t algorithm,
                                  int64_t activation, int64_t has_bias, int64_t has_residual) {
  const char* target = "jax_autotune_cublaslt_epilogue";
  const bool f32_in = lhs.element_type() == ffi::DataType::F32;
  if (auto e = check_attributes(target, f32_in, transpose_a, transpose_b, tf32, algorithm); e.failure())
    return e;
  if (auto e = check_epilogue_attributes(activation, has_bias, has_residual); e.failure()) return e;
  const auto out_dims = out->dimensions();
  const int64_t n = out_dims.size() == 3 ? out_dims[2] : -1;
  if (has_bias && (bias.element_type() != out->element_type() || bias.dimensions().size() != 1 ||
                   bias.dimensions()[0] != n))
    return ffi::Error::InvalidArgument(std::string(target) + ": bias must be (n,) in out's dtype, got " +
                                       dims_string(bias.dimensions()) + " " + dtype_name(bias.element_type()));
  if (has_residual && (residual.element_type() != out->element_type() ||
                       dims_string(residual.dimensions()) != dims_string(out_dims)))
    return ffi::Error::InvalidArgument(std::string(target) + ": residual must be out's shape and dtype, got " +
                                       dims_string(residual.dimensions()) + " " +
                                       dtype_name(residual.element_type()));
  static constexpr uint32_t kCodes[3][2] = {{kEpilogueDefault, kEpilogueBias},
                                            {kEpilogueRelu, kEpilogueReluBias},
                                            {kEpilogueGelu, kEpilogueGeluBias}};
  Epilogue epilogue{kCodes[activation][has_bias], has_bias ? bias.untyped_data() : nullptr,
                    has_residual ? residual.untyped_data() : nullptr};
  return run_matmul(target, stream, device, lhs, rhs, out, workspace, transpose_a, transpose_b,
                    tf32, algorithm, epilogue);
}

}  // namespace

std::string cublaslt_attribute_error(bool f32_operands, int64_t transpose_a, int64_t transpose_b,
                                     int64_t tf32, int64_t algorithm) {
  return check_attributes("jax_autotune_cublaslt", f32_operands, transpose_a, transpose_b, tf32,
                          algorithm).message();
}

std::string cublaslt_epilogue_attribute_error(int64_t activation, int64_t has_bias,
                                              int64_t has_residual) {
  return check_epilogue_attributes(activation, has_bias, has_residual).message();
}

std::string load_cublaslt(const std::string& path) {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (!lib.path.empty()) return "";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return std::string("dlopen failed: ") + dlerror();
  Api api{};
  const bool ok = resolve(handle, "cublasLtCreate", &api.create) &&
                  resolve(handle, "cublasLtMatmulDescCreate", &api.desc_create) &&
                  resolve(handle, "cublasLtMatmulDescSetAttribute", &api.desc_set) &&
                  resolve(handle, "cublasLtMatrixLayoutCreate", &api.layout_create) &&
                  resolve(handle, "cublasLtMatrixLayoutSetAttribute", &api.layout_set) &&
                  resolve(handle, "cublasLtMatmulPreferenceCreate", &api.preference_create) &&
                  resolve(handle, "cublasLtMatmulPreferenceSetAttribute", &api.preference_set) &&
                  resolve(handle, "cublasLtMatmulPreferenceDestroy", &api.preference_destroy) &&
                  resolve(handle, "cublasLtMatmulAlgoGetHeuristic", &api.heuristic) &&
                  resolve(handle, "cublasLtMatmul", &api.matmul) &&
                  resolve(handle, "cublasLtGetVersion", &api.version);
  if (!ok) {
    dlclose(handle);
    return "not a cuBLASLt library (a cublasLt* entry point is missing): " + path;
  }
  lib.api = api;
  lib.path = path;
  return "";
}

std::string cublaslt_library() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return lib.path;
}

size_t cublaslt_version() {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  return lib.path.empty() ? 0 : lib.api.version();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CublasLtHandler, cublaslt_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("transpose_a")
                                  .Attr<int64_t>("transpose_b")
                                  .Attr<int64_t>("tf32")
                                  .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CublasLtEpilogueHandler, cublaslt_epilogue_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("transpose_a")
                                  .Attr<int64_t>("transpose_b")
                                  .Attr<int64_t>("tf32")
                                  .Attr<int64_t>("algorithm")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("has_bias")
                                  .Attr<int64_t>("has_residual"));

std::vector<std::pair<const char*, XLA_FFI_Handler*>> cuda_ffi_handlers() {
  return {{"jax_autotune_cublaslt", CublasLtHandler},
          {"jax_autotune_cublaslt_epilogue", CublasLtEpilogueHandler}};
}

}  // namespace jat
