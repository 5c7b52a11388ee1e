// The nanobind module jax_autotune._native: FFI handler capsules and ISA / build facts.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "blas.h"
#include "cublas_grouped.h"
#include "cublaslt.h"
#include "handlers.h"
#include "isa.h"
#include "kernel_table.h"
#include "thread_pool.h"
#include "throughput.h"

namespace nb = nanobind;

namespace {

nb::dict registrations() {
  nb::dict out;
  for (const auto& [name, handler] : jat::ffi_handlers())
    out[name] = nb::capsule(reinterpret_cast<void*>(handler));
  return out;
}

nb::dict cuda_registrations() {
  nb::dict out;
  for (const auto& [name, handler] : jat::cuda_ffi_handlers())
    out[name] = nb::capsule(reinterpret_cast<void*>(handler));
  for (const auto& [name, handler] : jat::cublas_grouped_handlers())
    out[name] = nb::capsule(reinterpret_cast<void*>(handler));
  return out;
}

// Register tiles of each ISA this build has: {isa: [(mr, nr_f32, nr_f64), ...]}.
nb::dict gemm_tiles() {
  nb::dict out;
  for (jat::Isa isa : {jat::Isa::kPortable, jat::Isa::kAvx2, jat::Isa::kAvx512}) {
#if !defined(JAT_HAVE_X86)
    if (isa != jat::Isa::kPortable) continue;
#endif
    nb::list tiles;
    for (const jat::GemmTile& t : jat::kernels_for(isa).tiles)
      tiles.append(nb::make_tuple(t.mr, t.nr_f32, t.nr_f64));
    out[jat::isa_name(isa)] = tiles;
  }
  return out;
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "jax_autotune native kernels (XLA FFI handlers); use jax_autotune.native.";
  m.attr("built_against_jaxlib") = JAT_JAXLIB_BUILD_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.attr("small_max_dim") = jat::kSmallMaxDim;
  m.attr("max_threads_attribute") = jat::kMaxThreadsAttribute;
  m.attr("cublaslt_max_algorithms") = jat::kCublasLtMaxAlgorithms;
  m.def("registrations", &registrations,
        "{FFI target name: PyCapsule of its XLA_FFI_Handler}, for jax.ffi.register_ffi_target.");
  m.def("isa", [] { return std::string(jat::isa_name(jat::isa_choice().effective)); },
        "The ISA the kernels use: 'portable', 'avx2' or 'avx512'.");
  m.def("best_isa", [] { return std::string(jat::isa_name(jat::isa_choice().best)); },
        "The best ISA this CPU supports, ignoring JAX_AUTOTUNE_NATIVE_ISA.");
  m.def("isa_note", [] { return jat::isa_choice().note; },
        "Why JAX_AUTOTUNE_NATIVE_ISA was not followed exactly ('' when it was).");
  m.def("cpu_features", [] { return jat::isa_features(jat::isa_choice().effective); },
        "Features of the effective ISA, e.g. ['avx2', 'fma'].");
  m.def("max_threads", &jat::available_threads,
        "Threads the kernels may use: the CPUs this process may run on.");
  m.def("gemm_tiles", &gemm_tiles, "{isa: [(mr, nr_f32, nr_f64), ...]} by tile index.");
  m.def("load_blas", &jat::load_blas, nb::arg("path"), nb::arg("prefix"),
        "dlopen a CBLAS library (symbols <prefix>cblas_sgemm, ...); '' or why it failed.");
  m.def("blas_library", &jat::blas_library, "Path of the loaded BLAS library, or ''.");
  m.def("cuda_registrations", &cuda_registrations,
        "{FFI target name: PyCapsule}, of the handlers for the CUDA platform (cuBLASLt, cuBLAS grouped).");
  m.def("load_cublaslt", &jat::load_cublaslt, nb::arg("path"),
        "dlopen a cuBLASLt library; '' or why it failed.");
  m.def("cublaslt_library", &jat::cublaslt_library, "Path of the loaded cuBLASLt, or ''.");
  m.def("cublaslt_attribute_error", &jat::cublaslt_attribute_error, nb::arg("f32_operands"),
        nb::arg("transpose_a"), nb::arg("transpose_b"), nb::arg("tf32"), nb::arg("algorithm"),
        "Why jax_autotune_cublaslt refuses these attributes, or '' (the handler's own check).");
  m.def("cublaslt_epilogue_attribute_error", &jat::cublaslt_epilogue_attribute_error,
        nb::arg("activation"), nb::arg("has_bias"), nb::arg("has_residual"),
        "Why jax_autotune_cublaslt_epilogue refuses its epilogue attributes, or ''.");
  m.def("cublaslt_version", &jat::cublaslt_version, "cublasLtGetVersion() of it, or 0.");
  m.def("load_cublas_grouped", &jat::load_cublas_grouped, nb::arg("cublas_path"), nb::arg("driver_path"),
        "dlopen cuBLAS (12.5 or newer) and the CUDA driver for the grouped GEMM; '' or why it failed.");
  m.def("cublas_grouped_library", &jat::cublas_grouped_library, "Path of the loaded cuBLAS, or ''.");
  m.def("cublas_grouped_attribute_error", &jat::cublas_grouped_attribute_error,
        nb::arg("f32_operands"), nb::arg("ragged_k"), nb::arg("transpose_b"), nb::arg("tf32"),
        "Why jax_autotune_cublas_grouped refuses these attributes, or '' (the handler's own check).");
  m.def("fma_seconds", &jat::fma_seconds, nb::arg("dtype"), nb::arg("iterations"),
        nb::arg("threads"), nb::call_guard<nb::gil_scoped_release>(),
        "Seconds for `threads` threads to each run `iterations` FMA rounds (probe).");
  m.def("fma_flops_per_iteration", &jat::fma_flops_per_iteration, nb::arg("dtype"),
        "Floating-point operations in one FMA round of one thread.");
  m.def("copy_seconds", &jat::copy_seconds, nb::arg("bytes"), nb::arg("threads"),
        nb::call_guard<nb::gil_scoped_release>(),
        "Seconds to copy `bytes` between two buffers with `threads` threads (probe).");
}
