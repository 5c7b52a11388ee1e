// The XLA FFI handlers of the native kernels, by target name.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jat {

// (FFI target name, handler) for every kernel family; native.py registers them all.
std::vector<std::pair<const char*, XLA_FFI_Handler*>> ffi_handlers();

}  // namespace jat
