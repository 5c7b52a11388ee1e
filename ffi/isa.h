// Which ISA the kernels run with: detected once, lowered by JAX_AUTOTUNE_NATIVE_ISA.
#pragma once

#include <string>
#include <vector>

#include "kernel_table.h"

namespace jat {

struct IsaChoice {
  Isa best;          // the best ISA this CPU (and this build) supports
  Isa effective;     // what the kernels use: best, or lower when the env var asks for it
  std::string note;  // empty, or why the env var was not followed exactly
};

// Detected on first call: __builtin_cpu_supports, then the JAX_AUTOTUNE_NATIVE_ISA override.
const IsaChoice& isa_choice();

const char* isa_name(Isa isa);

// Parses "portable" | "avx2" | "avx512"; false when the name is none of them.
bool parse_isa(const std::string& name, Isa* isa);

// The kernel table of `isa`; only call it for isa <= isa_choice().effective.
const KernelTable& kernels_for(Isa isa);

// CPU features the effective ISA provides, e.g. {"avx2", "fma"}.
std::vector<std::string> isa_features(Isa isa);

}  // namespace jat
