// AVX2 + FMA kernels: 32-byte vectors; compiled with -mavx2 -mfma, used only when the CPU has both.
#define JAT_VEC_BYTES 32
#include "kernels_impl.h"

namespace jat {
// tiles 6x16 and 4x24 (f32): 12 accumulators + B + broadcast in the 16 ymm registers
const KernelTable kAvx2Kernels = make_table<6, 2, 4, 3>("avx2");
}  // namespace jat
