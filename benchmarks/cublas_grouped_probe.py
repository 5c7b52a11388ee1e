"""cuBLAS's grouped GEMM (``cublasGemmGroupedBatchedEx``) on the MoE suite's cases, before
building it as a candidate: its device time against torch's grouped matmul and a dense
matmul of the same FLOPs, forward (rows split among experts) and weight gradient (the
contraction split), and what a custom call would add: the group sizes live on the device
and cuBLAS takes each group's m, n, k on the host, so every call copies them back and
waits for the stream.

    python benchmarks/cublas_grouped_probe.py --out cublas_grouped_probe.json

Needs a GPU, torch and the cuBLAS library torch loads (12.5 or newer). Device time per call
by torch.profiler (median of rounds); the host-sync cost by the wall clock, waited.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

import peers
from moe_suite import CASES, group_sizes

R16BF, COMPUTE_32F, OP_N, OP_T = 14, 68, 0, 1  # cudaDataType_t, cublasComputeType_t, cublasOperation_t


def _cublas() -> ctypes.CDLL:
    import torch  # noqa: F401 - loads the cuBLAS that torch uses
    names = ["libcublas.so.13", "libcublas.so.12"]
    for pattern in ("nvidia/cu13/lib/libcublas.so.*", "nvidia/cublas/lib/libcublas.so.*"):
        for root in sys.path:
            names += glob.glob(os.path.join(root, pattern))
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            lib.cublasGemmGroupedBatchedEx  # noqa: B018 - 12.5 and newer
            return lib
        except (OSError, AttributeError):
            continue
    raise RuntimeError(f"no libcublas with cublasGemmGroupedBatchedEx among {names}")


class Grouped:
    """One grouped GEMM call per ``__call__``: row-major ``out[g] = a[g] @ b[g]`` for each
    group, as cuBLAS's column-major ``out[g]^T = b[g]^T a[g]^T``."""

    def __init__(self, lib, handle, problems):
        import torch
        # problems: (a, b, out, transpose_a, transpose_b); a and b as stored (rows contiguous),
        # the product reading a.T where transpose_a, b.T where transpose_b
        self.lib, self.handle, self.count = lib, handle, len(problems)
        g = self.count
        ints = ctypes.c_int * g
        self.transa = ints(*[OP_T if tb else OP_N for _, _, _, _, tb in problems])  # cuBLAS's A is our b
        self.transb = ints(*[OP_T if ta else OP_N for _, _, _, ta, _ in problems])
        self.m = ints(*[out.shape[1] for _, _, out, _, _ in problems])
        self.n = ints(*[out.shape[0] for _, _, out, _, _ in problems])
        self.k = ints(*[(a.shape[0] if ta else a.shape[1]) for a, _, _, ta, _ in problems])
        self.lda = ints(*[b.stride(0) for _, b, _, _, _ in problems])
        self.ldb = ints(*[a.stride(0) for a, _, _, _, _ in problems])
        self.ldc = ints(*[out.stride(0) for _, _, out, _, _ in problems])
        self.alpha = (ctypes.c_float * g)(*[1.0] * g)
        self.beta = (ctypes.c_float * g)(*[0.0] * g)
        self.sizes = ints(*[1] * g)
        pointers = lambda xs: torch.tensor([x.data_ptr() for x in xs], dtype=torch.int64, device="cuda")  # noqa: E731
        self.a = pointers([b for _, b, _, _, _ in problems])
        self.b = pointers([a for a, _, _, _, _ in problems])
        self.c = pointers([out for _, _, out, _, _ in problems])

    def __call__(self):
        status = self.lib.cublasGemmGroupedBatchedEx(
            self.handle, self.transa, self.transb, self.m, self.n, self.k, self.alpha,
            ctypes.c_void_p(self.a.data_ptr()), R16BF, self.lda, ctypes.c_void_p(self.b.data_ptr()), R16BF,
            self.ldb, self.beta, ctypes.c_void_p(self.c.data_ptr()), R16BF, self.ldc, self.count,
            self.sizes, COMPUTE_32F)
        if status != 0:
            raise RuntimeError(f"cublasGemmGroupedBatchedEx: status {status}")


def _case(lib, handle, case, split) -> dict:
    import torch
    sizes = [int(s) for s in group_sizes(case, split)]
    starts = [sum(sizes[:g]) for g in range(case.experts)]
    x = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(case.experts, case.k, case.n, device="cuda", dtype=torch.bfloat16) / case.k ** 0.5
    dy = torch.randn(case.m, case.n, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(case.m, case.n, device="cuda", dtype=torch.bfloat16)
    dw = torch.zeros(case.experts, case.k, case.n, device="cuda", dtype=torch.bfloat16)
    live = [g for g in range(case.experts) if sizes[g]]
    rows = lambda t, g: t[starts[g]:starts[g] + sizes[g]]  # noqa: E731
    forward = Grouped(lib, handle, [(rows(x, g), w[g], rows(out, g), False, False) for g in live])
    weight_grad = Grouped(lib, handle, [(rows(x, g), rows(dy, g), dw[g], True, False) for g in live])
    forward(); weight_grad(); torch.cuda.synchronize()
    errors = {}
    for name, got, want in (
            ("forward", out, torch.cat([rows(x, g).float() @ w[g].float() for g in range(case.experts)])),
            ("weight_grad", dw, torch.stack([rows(x, g).float().t() @ rows(dy, g).float() for g in range(case.experts)]))):
        errors[name] = float(((got.float() - want).abs().max() / want.abs().max()).item())
    offsets = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    a_dense = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16)
    b_dense = torch.randn(case.k, case.n, device="cuda", dtype=torch.bfloat16)
    row = {"case": case.name, "experts": case.experts, "m": case.m, "k": case.k, "n": case.n, "split": split,
           "max_rel_err": errors,
           "cublas_forward_us": peers.torch_kernel_us(forward),
           "cublas_weight_grad_us": peers.torch_kernel_us(weight_grad),
           "dense_us": peers.torch_kernel_us(lambda: a_dense @ b_dense)}
    for name, fn in (("torch_forward_us", lambda: torch._grouped_mm(x, w, offs=offsets)),
                     ("torch_weight_grad_us", lambda: torch._grouped_mm(x.t(), dy, offs=offsets))):
        try:
            row[name] = peers.torch_kernel_us(fn)
        except Exception as err:  # noqa: BLE001 - a peer that fails is reported as such
            row[name] = f"{type(err).__name__}: {err}"[:160]
    device_sizes = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    host = torch.empty(case.experts, dtype=torch.int32, pin_memory=True)
    walls = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(device_sizes, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        walls.append(time.perf_counter() - t0)
    row["sizes_to_host_us"] = statistics.median(walls) * 1e6
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--cases", default="mixtral_up,deepseek_up,qwen_moe_up,qwen_moe_down")
    args = parser.parse_args()
    import torch
    lib = _cublas()
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    version = ctypes.c_int()
    lib.cublasGetVersion_v2(handle, ctypes.byref(version))
    rows = []
    for name in args.cases.split(","):
        case = next(c for c in CASES if c.name == name)
        for split in ("equal", "skewed"):
            try:
                rows.append(_case(lib, handle, case, split))
            except Exception as err:  # noqa: BLE001 - one case failing is reported
                rows.append({"case": name, "split": split, "error": f"{type(err).__name__}: {err}"[:300]})
            print(json.dumps(rows[-1]), flush=True)
    result = {"cublas_version": version.value, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(), "rows": rows}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
