"""The vector-add kernel of the triton-windows README ("Test if it works"), its launcher
and its torch reference. It is the self-test's kernel: if this compiles and runs, the
compiler, the C launcher build (include/libs, the C compiler), the driver and the cache
all work."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import cdiv, kernel_for

BLOCK_SIZE = 1024


@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x + y through Triton, on CUDA tensors or (interpreter / triton-cpu) CPU tensors."""
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(
            f"add() needs two tensors of one shape, dtype and device; got {tuple(x.shape)} {x.dtype} {x.device} "
            f"and {tuple(y.shape)} {y.dtype} {y.device}"
        )
    x, y = x.contiguous(), y.contiguous()
    if out is None:
        out = torch.empty_like(x)
    n = out.numel()
    grid = (cdiv(n, BLOCK_SIZE),)
    kernel_for(add_kernel, x.device.type)[grid](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return out


def add_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


# For the cross-architecture compile tests: (kernel, signature, constexprs) sets.
COMPILE_SPECS = [
    (add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "output_ptr": "*fp32", "n_elements": "i32", "BLOCK_SIZE": "constexpr"},
     {"BLOCK_SIZE": BLOCK_SIZE}),
    (add_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "output_ptr": "*fp16", "n_elements": "i32", "BLOCK_SIZE": "constexpr"},
     {"BLOCK_SIZE": BLOCK_SIZE}),
]
