#include "isa.h"

#include <cstdlib>

namespace jat {
namespace {

Isa detect_best() {
#if defined(JAT_HAVE_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

IsaChoice choose() {
  IsaChoice choice{detect_best(), Isa::kPortable, ""};
  choice.effective = choice.best;
  const char* env = std::getenv("JAX_AUTOTUNE_NATIVE_ISA");
  if (env == nullptr || *env == '\0') return choice;
  Isa requested;
  if (!parse_isa(env, &requested)) {
    choice.note = std::string("JAX_AUTOTUNE_NATIVE_ISA=") + env +
                  " is not one of portable|avx2|avx512; using " + isa_name(choice.best);
  } else if (static_cast<int>(requested) > static_cast<int>(choice.best)) {
    choice.note = std::string("JAX_AUTOTUNE_NATIVE_ISA=") + env +
                  " is not supported by this CPU; using " + isa_name(choice.best);
  } else {
    choice.effective = requested;
  }
  return choice;
}

}  // namespace

const IsaChoice& isa_choice() {
  static const IsaChoice choice = choose();
  return choice;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

bool parse_isa(const std::string& name, Isa* isa) {
  for (Isa candidate : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (name == isa_name(candidate)) {
      *isa = candidate;
      return true;
    }
  }
  return false;
}

const KernelTable& kernels_for(Isa isa) {
#if defined(JAT_HAVE_X86)
  if (isa == Isa::kAvx512) return kAvx512Kernels;
  if (isa == Isa::kAvx2) return kAvx2Kernels;
#endif
  return kPortableKernels;
}

std::vector<std::string> isa_features(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return {"avx2", "fma", "avx512f", "avx512dq", "avx512vl"};
    case Isa::kAvx2: return {"avx2", "fma"};
    default: return {};
  }
}

}  // namespace jat
