"""Checks ffi/cublaslt_abi.h against the real cuBLASLt headers, where they are installed.

The native module declares the few cuBLASLt types and enum values it uses itself, so that
it builds with no CUDA headers; this compiles those declarations next to cublasLt.h with
static_asserts. Run where the headers are (the nvidia-cublas wheel or a CUDA toolkit):

    python benchmarks/check_cublaslt_abi.py      # prints a JSON line; exit 1 on a mismatch
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKS = r"""
#include <cstddef>
#include <cublasLt.h>
#include "cublaslt_abi.h"
using namespace jat::lt;
static_assert(kR32F == CUDA_R_32F && kR16F == CUDA_R_16F && kR16BF == CUDA_R_16BF, "dtypes");
static_assert(kCompute32F == CUBLAS_COMPUTE_32F && kCompute32FFastTf32 == CUBLAS_COMPUTE_32F_FAST_TF32, "compute");
static_assert(kOpN == CUBLAS_OP_N && kOpT == CUBLAS_OP_T, "ops");
static_assert(kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA && kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB
              && kDescEpilogue == CUBLASLT_MATMUL_DESC_EPILOGUE
              && kDescBiasPointer == CUBLASLT_MATMUL_DESC_BIAS_POINTER, "desc");
static_assert(kEpilogueDefault == CUBLASLT_EPILOGUE_DEFAULT && kEpilogueRelu == CUBLASLT_EPILOGUE_RELU
              && kEpilogueBias == CUBLASLT_EPILOGUE_BIAS && kEpilogueReluBias == CUBLASLT_EPILOGUE_RELU_BIAS
              && kEpilogueGelu == CUBLASLT_EPILOGUE_GELU && kEpilogueGeluBias == CUBLASLT_EPILOGUE_GELU_BIAS,
              "epilogues");
static_assert(kLayoutBatchCount == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
              && kLayoutBatchStride == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, "layout");
static_assert(kPrefMaxWorkspace == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
              && kPrefAlignA == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES
              && kPrefAlignB == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES
              && kPrefAlignC == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES
              && kPrefAlignD == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, "preference");
static_assert(sizeof(Algo) == sizeof(cublasLtMatmulAlgo_t), "algo size");
static_assert(sizeof(HeuristicResult) == sizeof(cublasLtMatmulHeuristicResult_t), "result size");
static_assert(offsetof(HeuristicResult, workspace_size) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize)
              && offsetof(HeuristicResult, state) == offsetof(cublasLtMatmulHeuristicResult_t, state)
              && offsetof(HeuristicResult, waves_count) == offsetof(cublasLtMatmulHeuristicResult_t, wavesCount),
              "result layout");
static_assert(sizeof(Status) == sizeof(cublasStatus_t) && CUBLAS_STATUS_SUCCESS == 0, "status");
"""


def include_dirs() -> list[str]:
    """Folders holding cublasLt.h and library_types.h: the nvidia wheels', then CUDA's."""
    roots = []
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        roots += glob.glob(os.path.join(root, "*", "include"))
    roots += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    return [r for r in roots if os.path.isdir(r)]


def main() -> int:
    dirs = include_dirs()
    header = next((os.path.join(d, "cublasLt.h") for d in dirs
                   if os.path.exists(os.path.join(d, "cublasLt.h"))), None)
    if header is None:
        print(json.dumps({"checked": False, "reason": "no cublasLt.h found", "searched": dirs}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp, "abi_check.cc")
        source.write_text(CHECKS)
        command = ["c++", "-std=c++17", "-fsyntax-only", f"-I{ROOT / 'ffi'}",
                   *[f"-I{d}" for d in dirs], str(source)]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    print(json.dumps({"checked": True, "header": header, "ok": run.returncode == 0,
                      "compiler_output": run.stderr[-2000:]}))
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
