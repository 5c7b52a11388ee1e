// The few cuBLASLt declarations cublaslt.cc uses, from cublasLt.h, cublas_api.h and
// library_types.h, so that the module builds with no CUDA headers. Their values have been
// stable since CUDA 11; benchmarks/check_cublaslt_abi.py checks them against the real
// headers where those are installed (on an H200: benchmarks/results/).
#pragma once

#include <cstddef>
#include <cstdint>

namespace jat {
namespace lt {

using Status = int;  // cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS
using LtHandle = void*;
using MatmulDesc = void*;
using MatrixLayout = void*;
using Preference = void*;
struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;           // cudaDataType_t
constexpr int kCompute32F = 68, kCompute32FFastTf32 = 77;  // cublasComputeType_t
constexpr int kOpN = 0, kOpT = 1;                          // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7,
              kDescBiasPointer = 8;  // cublasLtMatmulDescAttributes_t
// cublasLtEpilogue_t
constexpr uint32_t kEpilogueDefault = 1, kEpilogueRelu = 2, kEpilogueBias = 4,
                   kEpilogueReluBias = 6, kEpilogueGelu = 32, kEpilogueGeluBias = 36;
constexpr int kLayoutBatchCount = 5, kLayoutBatchStride = 6;  // ...MatrixLayoutAttribute_t
constexpr int kPrefMaxWorkspace = 1, kPrefAlignA = 5, kPrefAlignB = 6, kPrefAlignC = 7,
              kPrefAlignD = 8;  // cublasLtMatmulPreferenceAttributes_t

}  // namespace lt
}  // namespace jat
