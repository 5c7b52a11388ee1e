#include "matmul_shapes.h"

namespace ffi = xla::ffi;

namespace jat {

std::string dims_string(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

const char* dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::S32: return "int32";
    default: return "an unsupported dtype";
  }
}

ffi::Error check_shapes(const char* target, const ffi::AnyBuffer& lhs, const ffi::AnyBuffer& rhs,
                        const ffi::AnyBuffer& out, bool ta, bool tb, Shapes* shapes) {
  auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out.dimensions();
  const std::string where = std::string(target) + ": ";
  if (ld.size() != 3 || rd.size() != 3 || od.size() != 3)
    return ffi::Error::InvalidArgument(where + "lhs, rhs and out must be rank 3 (batch, rows, "
                                       "cols); got lhs " + dims_string(ld) + ", rhs " +
                                       dims_string(rd) + ", out " + dims_string(od));
  const int64_t m = ta ? ld[2] : ld[1], k = ta ? ld[1] : ld[2];
  const int64_t k_rhs = tb ? rd[2] : rd[1], n = tb ? rd[1] : rd[2];
  if (k != k_rhs || ld[0] != rd[0] || od[0] != ld[0] || od[1] != m || od[2] != n)
    return ffi::Error::InvalidArgument(
        where + "shapes do not form (batch, m, k) x (batch, k, n) -> (batch, m, n) with "
        "transpose_a=" + std::to_string(ta) + ", transpose_b=" + std::to_string(tb) +
        ": lhs " + dims_string(ld) + ", rhs " + dims_string(rd) + ", out " + dims_string(od));
  *shapes = Shapes{ld[0], m, n, k};
  return ffi::Error::Success();
}

ffi::Error check_attribute(const char* target, const char* name, int64_t value, int64_t lo,
                           int64_t hi, const char* expected) {
  if (value >= lo && value <= hi) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string(target) + ": attribute " + name + " must be " +
                                     expected + ", got " + std::to_string(value));
}

}  // namespace jat
