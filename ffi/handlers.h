// The XLA FFI handlers of the native kernels, by target name.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jat {

// The largest `threads` attribute a kernel call takes (more than any machine has; a call
// asking for more threads than are here uses them all).
constexpr int64_t kMaxThreadsAttribute = 1 << 16;

// (FFI target name, handler) for every kernel family; native.py registers them all.
std::vector<std::pair<const char*, XLA_FFI_Handler*>> ffi_handlers();

}  // namespace jat
