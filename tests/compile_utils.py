"""Cross-architecture compilation without a GPU: ``triton.compile`` for a GPUTarget runs the
whole pipeline down to the cubin (ptxas included) on a CPU-only machine."""
from __future__ import annotations

ARCHS = (75, 80, 86, 89, 90, 120)


def compile_for(kernel, signature: dict, constexprs: dict, cc: int, num_warps: int = 4, num_stages: int = 3):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
