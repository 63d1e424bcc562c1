#!/usr/bin/env python3
"""Allocates GPU memory through the CUDA driver (libcuda, no toolkit
needed) in 1 GiB steps and holds it: `cuda_alloc.py GIB HOLD_SECS`.
Prints what CUDA says the GPU has, and how far it got; exits 2 when an
allocation is refused (past an MPS client's pinned memory limit, say)."""

import ctypes
import sys
import time


def main() -> int:
    gib, hold = float(sys.argv[1]), float(sys.argv[2])
    cuda = ctypes.CDLL("libcuda.so.1")

    def name(code: int) -> str:
        text = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(text))
        return (text.value or b"?").decode()

    def check(code: int, what: str) -> None:
        if code != 0:
            print(f"{what}: {name(code)}", flush=True)
            sys.exit(3)

    check(cuda.cuInit(0), "cuInit")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    print(f"CUDA sees {total.value >> 20} MiB, {free.value >> 20} MiB free", flush=True)
    held, step = [], 1 << 30
    while len(held) < gib:
        pointer = ctypes.c_uint64()
        code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(step))
        if code != 0:
            print(f"allocation refused after {len(held)} GiB: {name(code)}", flush=True)
            return 2
        held.append(pointer)
    print(f"allocated {len(held)} GiB", flush=True)
    time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
