// Baseline kernels: 16-byte vectors (SSE2 on x86-64, NEON on aarch64), no extra -m flags.
#define JAT_VEC_BYTES 16
#include "kernels_impl.h"

namespace jat {
// tiles 4x8 and 6x8 (f32): 8 and 12 accumulators of the 16 xmm registers
const KernelTable kPortableKernels = make_table<4, 2, 6, 2>("portable");
}  // namespace jat
