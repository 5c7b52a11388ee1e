// CPU throughput probes for the roofline bounds: FMA peak and copy bandwidth.
#pragma once

#include <cstdint>
#include <string>

namespace jat {

// Seconds for `threads` threads to each run `iterations` FMA rounds of the effective ISA;
// flops = threads * iterations * fma_flops_per_iteration(dtype).
double fma_seconds(const std::string& dtype, int64_t iterations, int threads);
int64_t fma_flops_per_iteration(const std::string& dtype);

// Seconds to copy a buffer of `bytes` into another with `threads` threads (bytes read plus
// bytes written = 2 * bytes). The buffers are allocated and touched once per size.
double copy_seconds(int64_t bytes, int threads);

}  // namespace jat
