// The canonical matmul operands every handler takes, their shape check, and the
// range check of an attribute.
//
// lhs (batch, m, k), or (batch, k, m) when transpose_a; rhs (batch, k, n), or (batch, n, k)
// when transpose_b; out (batch, m, n). Dtypes are each handler's own business.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jat {

struct Shapes {
  int64_t batch, m, n, k;
};

std::string dims_string(xla::ffi::AnyBuffer::Dimensions dims);
const char* dtype_name(xla::ffi::DataType t);

// Checks ranks and that lhs, rhs and out describe one canonical matmul; fills `shapes`.
//
//   Shapes s;
//   if (auto e = check_shapes("jax_autotune_gemm", lhs, rhs, *out, ta, tb, &s); e.failure())
//     return e;
xla::ffi::Error check_shapes(const char* target, const xla::ffi::AnyBuffer& lhs,
                             const xla::ffi::AnyBuffer& rhs, const xla::ffi::AnyBuffer& out,
                             bool ta, bool tb, Shapes* shapes);

// An int64 attribute must lie in [lo, hi]; else InvalidArgument naming the target, the
// attribute, `expected` (e.g. "0 or 1") and the value. An artifact's attributes are
// untrusted: every handler checks each one before it uses any.
//
//   if (auto e = check_attribute(target, "transpose_a", ta, 0, 1, "0 or 1"); e.failure()) return e;
xla::ffi::Error check_attribute(const char* target, const char* name, int64_t value, int64_t lo,
                                int64_t hi, const char* expected);

}  // namespace jat
