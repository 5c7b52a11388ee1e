// AVX-512F kernels: 64-byte vectors; compiled with -mavx512f..., used only when the CPU has it.
#define JAT_VEC_BYTES 64
#include "kernels_impl.h"

namespace jat {
// tiles 14x32 and 8x48 (f32): 28 and 24 accumulators of the 32 zmm registers
const KernelTable kAvx512Kernels = make_table<14, 2, 8, 3>("avx512");
}  // namespace jat
