// What the CUDA handlers (cublaslt.cc, cublas_grouped.cc) share: resolving a loaded
// library's entry points, and an XLA dtype as CUDA's cudaDataType_t.
#pragma once

#include <dlfcn.h>

#include "cublaslt_abi.h"
#include "xla/ffi/api/ffi.h"

namespace jat {

// `*out` = the entry point `name` of the dlopen()ed `handle`; false where it has none.
//
//   if (!resolve(handle, "cublasLtCreate", &api.create)) ...
template <typename F>
bool resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

// cudaDataType_t of f32, f16 and bf16; -1 for any other dtype.
inline int cuda_type(xla::ffi::DataType t) {
  switch (t) {
    case xla::ffi::DataType::F32: return lt::kR32F;
    case xla::ffi::DataType::F16: return lt::kR16F;
    case xla::ffi::DataType::BF16: return lt::kR16BF;
    default: return -1;
  }
}

}  // namespace jat
