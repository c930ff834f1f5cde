"""fp8 <-> fp16/bf16/fp32 casts with integer and bit operations only.

Official Triton refuses the ``fp8e4nv`` type (torch's ``float8_e4m3fn``) below sm89, so these
kernels never see an fp8 pointer: they read the raw bytes (a ``uint8`` view) and write the raw
bits of the result (an ``int16``/``int32`` view), so they compile for every architecture from
sm75 up, bf16 outputs included.

Semantics (checked in tests/test_fp8.py against torch's own casts):

* **decode** ``fp8 -> fp32/fp16/bf16``: bit-exact with ``x.to(dtype)`` for all 256 codes of both
  formats (±0, subnormals, max normal, ±inf of e5m2), NaN codes included: the NaN bit patterns
  are those torch's CPU casts give (e4m3fn NaN -> 0x7FF00000|sign in fp32, 0x7F80|sign in fp16;
  e5m2 NaN keeps its payload, quietened; bf16 NaN is 0x7FC0, sign dropped, as torch's
  fp32 -> bf16 rounding does). With a scale the value is ``(x.to(fp32) * scale).to(dtype)``:
  one fp32 multiply, then one round-to-nearest-even (fp16 overflow -> inf, underflow ->
  subnormal/0), again bit-exact with that torch expression for every non-NaN result.
  ``round_scale=True`` first rounds the scale to ``dtype`` (``(x.to(fp32) * s.to(dtype).to(fp32))
  .to(dtype)``), which is what ``x.to(dtype) * s.to(dtype)`` computes in torch for fp16/bf16 (the
  product of two such values is exact in fp32, and torch rounds it once): comfy-kitchen's eager
  ``dequantize_per_tensor_fp8``, i.e. ComfyUI 0.8's ``QuantizedTensor.dequantize()`` on the CPU.
* **encode** ``fp32/fp16/bf16 -> fp8``: round to nearest even, exactly torch's C++ conversion
  (``c10::detail::fp8e4m3fn_from_fp32_value`` / ``fp8e5m2_from_fp32_value``). Overflow:
  e5m2 never saturates in torch (overflow -> ±inf, NaN -> NaN). For e4m3fn torch changed
  behaviour: up to 2.11, eager ``.to(float8_e4m3fn)`` gives NaN for |x| >= 480 (and for values
  that round up into the NaN code, (464, 480)); from 2.12 (pytorch/pytorch#178817) finite
  overflow and ±inf saturate to ±448 and only NaN stays NaN. ``saturate=None`` (the default)
  follows the installed torch (probed once, see :func:`torch_saturates_e4m3fn`), so the kernel
  matches whatever torch the user has; ``saturate=True/False`` picks one explicitly (for e5m2,
  True clamps finite overflow and ±inf to ±57344).

Every cast reads each input byte once and writes each output element once (vectorised 1-D
blocks), and is exposed as a torch custom op (``torch.ops.tritonkit.fp8_decode`` /
``fp8_encode``) with a fake implementation, so ``torch.compile`` keeps it in the graph as an
opaque call: no graph break, and Inductor never generates code that touches the fp8 tensor.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import sys
import types
from typing import Optional

import torch
import triton
import triton.language as tl

from . import fast_launch
from .runtime import INTERPRETER_LOCK, OP_NAMESPACE, Serialized, cdiv, eager_plain, kernel_for, next_pow2, op_exists
from .runtime import launch as launch_kernel

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FMT = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
_OUT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_BITS_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}

DECODE_BLOCK = 4096
DECODE_WARPS = 4
ENCODE_BLOCK = 2048
ENCODE_WARPS = 4

# Kernel launches in this process, by op (read by the fp8 node's per-run summary and the tests).
# One Counter per process, not per import of this module: the custom ops below are defined once per
# process and keep calling the copy of this module that defined them, so when the pack is imported
# twice (ComfyUI's path-derived module name beside another name, as the tests and the bench do) the
# launches made through the ops and the counter read by the other copy must be the same object.
_PROCESS_STATE = "tritonkit_process_state"
LAUNCHES: collections.Counter = sys.modules.setdefault(
    _PROCESS_STATE, types.ModuleType(_PROCESS_STATE, "State the pack shares across its imports in one process"),
).__dict__.setdefault("fp8_launches", collections.Counter())


# ----------------------------------------------------------------------------- bit helpers
@triton.jit
def fp8_bits_to_f32_bits(b, FMT: tl.constexpr):
    """``b``: uint32 holding an fp8 code in its low byte. Returns the fp32 bits (uint32) of
    its value, with torch's NaN patterns. FMT 0 = e4m3fn, 1 = e5m2."""
    sign = (b & 0x80) << 24
    if FMT == 0:
        e = (b >> 3) & 0xF
        mag = ((b & 0x7F) << 20) + (120 << 23)  # exponent rebias 7 -> 127; exact for e >= 1
        # e == 0: 2^-6 * (1 + m/8) - 2^-6 == m * 2^-9, exact in fp32 (and 0 for m == 0)
        sub = ((mag + (1 << 23)).to(tl.float32, bitcast=True) - 0.015625).to(tl.uint32, bitcast=True)
        mag = tl.where(e == 0, sub, mag)
        mag = tl.where((b & 0x7F) == 0x7F, 0x7FF00000, mag)
    else:
        e = (b >> 2) & 0x1F
        mag = ((b & 0x7F) << 21) + (112 << 23)  # exponent rebias 15 -> 127
        sub = ((mag + (1 << 23)).to(tl.float32, bitcast=True) - 6.103515625e-05).to(tl.uint32, bitcast=True)
        mag = tl.where(e == 0, sub, mag)
        special = ((b & 0x3) << 21) | 0x7F800000  # inf (m == 0) or NaN with its payload, quietened
        special = tl.where((b & 0x3) != 0, special | 0x400000, special)
        mag = tl.where(e == 31, special, mag)
    return mag | sign


@triton.jit
def f32_bits_to_f16_bits_exact(u):
    """fp32 bits of a value exactly representable in fp16 (every fp8 value is) -> fp16 bits
    (uint32, low half). inf/NaN keep the top mantissa bits, as torch's conversion does."""
    sign = (u >> 16) & 0x8000
    mag = u & 0x7FFFFFFF
    h = tl.where(mag == 0, 0, (mag >> 13) - (112 << 10))
    h = tl.where(mag >= 0x7F800000, 0x7C00 | ((mag >> 13) & 0x3FF), h)
    return h | sign


@triton.jit
def f32_bits_to_bf16_bits_rne(u):
    """torch's fp32 -> bf16 rounding (c10::round_to_nearest_even): NaN -> 0x7FC0."""
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where(is_nan, 0x7FC0, r)


@triton.jit
def f16_bits_to_f32_bits(h):
    """fp16 bits (uint32, low half) -> fp32 bits, exact, subnormals included."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    mag = ((h & 0x7FFF) << 13) + (112 << 23)
    sub = ((mag + (1 << 23)).to(tl.float32, bitcast=True) - 6.103515625e-05).to(tl.uint32, bitcast=True)
    mag = tl.where(e == 0, sub, mag)
    mag = tl.where(e == 31, 0x7F800000 | ((h & 0x3FF) << 13), mag)
    return mag | sign


@triton.jit
def f32_bits_to_fp8_bits(u, FMT: tl.constexpr, SATURATE: tl.constexpr):
    """torch's fp32 -> fp8 conversion (round to nearest even) on bits; returns uint32 codes."""
    sign = (u >> 24) & 0x80
    f = u & 0x7FFFFFFF
    if FMT == 0:
        # below 2^-6: add 2^14 so that the fp32 adder rounds to the subnormal step 2^-9
        dn = (f.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - (141 << 23)
        nm = ((f - (120 << 23) + 0x7FFFF + ((f >> 20) & 1)) >> 20) & 0xFF
        r = tl.where(f < (121 << 23), dn, nm)
        if SATURATE:
            r = tl.where(r == 0x7F, 0x7E, r)
            r = tl.where(f >= (1087 << 20), tl.where(f > 0x7F800000, 0x7F, 0x7E), r)
        else:
            r = tl.where(f >= (1087 << 20), 0x7F, r)
    else:
        dn = (f.to(tl.float32, bitcast=True) + 128.0).to(tl.uint32, bitcast=True) - (134 << 23)
        nm = ((f - (112 << 23) + 0xFFFFF + ((f >> 21) & 1)) >> 21) & 0xFF
        r = tl.where(f < (113 << 23), dn, nm)
        if SATURATE:
            r = tl.where(r >= 0x7C, 0x7B, r)
            r = tl.where(f >= (143 << 23), tl.where(f > 0x7F800000, 0x7F, 0x7B), r)
        else:
            r = tl.where(f >= (143 << 23), tl.where(f > 0x7F800000, 0x7F, 0x7C), r)
    return r | sign


# ----------------------------------------------------------------------------- kernels
@triton.jit
def fp8_decode_kernel(x_ptr, out_ptr, scale_ptr, n, C, FMT: tl.constexpr, OUT: tl.constexpr,
                      SCALE: tl.constexpr, BLOCK: tl.constexpr, BIG: tl.constexpr, ROUND_SCALE: tl.constexpr = False):
    """x_ptr: uint8 codes; out_ptr: int32 (fp32 out) or int16 (fp16/bf16 out) bits.
    SCALE 0: none, 1: one fp32 scale, 2: one fp32 scale per row of C elements. ROUND_SCALE:
    the scale is rounded to the output dtype (nearest even) before the fp32 multiply."""
    pid = tl.program_id(0)
    if BIG:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32)
    if SCALE == 0:
        if FMT == 1 and OUT == 1:
            # e5m2 is the top byte of an fp16; NaN payloads are quietened as torch does
            h = (b << 8) | tl.where(((b & 0x7C) == 0x7C) & ((b & 0x3) != 0), 0x200, 0)
            r = h.to(tl.uint16).to(tl.int16, bitcast=True)
        elif FMT == 0 and OUT != 0:
            # Few instructions per byte (this kernel is instruction-bound at HBM speed): the bits
            # ((b & 0x7F) << 7) | sign read as an fp16 are the value / 256 for every code,
            # subnormals included; the fp16 multiply by 256 is exact and never flushes.
            h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
            v = h.to(tl.uint16).to(tl.float16, bitcast=True) * 256.0
            nan = (b & 0x7F) == 0x7F
            if OUT == 1:
                r = tl.where(nan, h | 0x7F80, v.to(tl.uint16, bitcast=True).to(tl.uint32))
            else:  # bf16: the exact fp32 value's top half
                r = tl.where(nan, 0x7FC0, v.to(tl.float32).to(tl.uint32, bitcast=True) >> 16)
            r = r.to(tl.uint16).to(tl.int16, bitcast=True)
        elif FMT == 1 and OUT == 2:
            v = (b << 8).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            nan = ((b & 0x7C) == 0x7C) & ((b & 0x3) != 0)
            r = tl.where(nan, 0x7FC0, v.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
        else:
            u = fp8_bits_to_f32_bits(b, FMT)
            if OUT == 0:
                r = u.to(tl.int32, bitcast=True)
            elif OUT == 1:
                r = f32_bits_to_f16_bits_exact(u).to(tl.uint16).to(tl.int16, bitcast=True)
            else:
                r = f32_bits_to_bf16_bits_rne(u).to(tl.uint16).to(tl.int16, bitcast=True)
    else:
        if SCALE == 1:
            s = tl.load(scale_ptr)
        else:
            s = tl.load(scale_ptr + offs // C, mask=mask, other=1.0)
        if ROUND_SCALE:
            if OUT == 1:
                s = s.to(tl.float16).to(tl.float32)
            elif OUT == 2:
                s = (f32_bits_to_bf16_bits_rne(s.to(tl.uint32, bitcast=True)) << 16).to(tl.float32, bitcast=True)
        v = fp8_bits_to_f32_bits(b, FMT).to(tl.float32, bitcast=True) * s
        if OUT == 0:
            r = v.to(tl.int32, bitcast=True)
        elif OUT == 1:
            r = v.to(tl.float16).to(tl.int16, bitcast=True)
        else:
            r = f32_bits_to_bf16_bits_rne(v.to(tl.uint32, bitcast=True)).to(tl.uint16).to(tl.int16, bitcast=True)
    tl.store(out_ptr + offs, r, mask=mask)


@triton.jit
def fp8_encode_kernel(x_ptr, out_ptr, scale_ptr, n, C, FMT: tl.constexpr, IN: tl.constexpr,
                      SCALE: tl.constexpr, SATURATE: tl.constexpr, BLOCK: tl.constexpr,
                      BIG: tl.constexpr):
    """x_ptr: int32 (fp32 in) or int16 (fp16/bf16 in) bits; out_ptr: uint8 codes.
    The value encoded is x / scale (torch: ``(x.float() / scale).to(fp8)``)."""
    pid = tl.program_id(0)
    if BIG:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if IN == 0:
        u = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    else:
        h = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint16, bitcast=True).to(tl.uint32)
        if IN == 1:
            u = f16_bits_to_f32_bits(h)
        else:
            u = h << 16
    if SCALE != 0:
        if SCALE == 1:
            s = tl.load(scale_ptr)
        else:
            s = tl.load(scale_ptr + offs // C, mask=mask, other=1.0)
        u = tl.math.div_rn(u.to(tl.float32, bitcast=True), s).to(tl.uint32, bitcast=True)
    r = f32_bits_to_fp8_bits(u, FMT, SATURATE)
    tl.store(out_ptr + offs, r.to(tl.uint8), mask=mask)


# ----------------------------------------------------------------------------- launchers
def _unwrap_jit(fn):
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    return fn


@functools.lru_cache(maxsize=None)
def _interpreted_with_helpers(jit_fn):
    """The Triton interpreter for a kernel that calls other @triton.jit helpers: the interpreter
    runs the kernel's Python source against its module globals, where the helpers are still
    JITFunctions (only callable when compiling), so it gets a copy of those globals in which
    every JIT helper is itself interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    fn = _unwrap_jit(jit_fn).fn
    g = dict(fn.__globals__)
    for name, val in list(g.items()):
        if isinstance(val, triton.runtime.JITFunction):
            f = val.fn
            g[name] = InterpretedFunction(types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__))
    return Serialized(InterpretedFunction(types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__,
                                                             fn.__closure__)))


@contextlib.contextmanager
def wrapping_int_math():
    """These kernels rely on uint32 arithmetic wrapping around (lanes that a tl.where then
    discards), which is what compiled Triton does. The interpreter's integer-overflow sanitizer
    would check every integer op in int64 (slow, and it is not a bug here): off while we run."""
    with INTERPRETER_LOCK:  # the builder's options are process-wide, like the interpreter
        try:
            import dataclasses
            from triton.runtime import interpreter
            builder = interpreter.interpreter_builder
            old = builder.options
            fast = dataclasses.replace(old, sanitize_overflow=False)
        except Exception:
            yield
            return
        builder.options = fast
        try:
            yield
        finally:
            builder.options = old


def launchable(jit_fn, device_type: str):
    """:func:`runtime.kernel_for`, with JIT helper functions working under the interpreter."""
    k = kernel_for(jit_fn, device_type)
    return k if k is jit_fn else _interpreted_with_helpers(jit_fn)


@functools.lru_cache(maxsize=None)
def torch_saturates_e4m3fn() -> bool:
    """Whether this torch's ``.to(float8_e4m3fn)`` saturates finite overflow to ±448 (torch
    >= 2.12) or gives NaN (torch <= 2.11)."""
    return int(torch.tensor([1000.0]).to(torch.float8_e4m3fn).view(torch.uint8)[0]) == 0x7E


def _scale_mode(scale: Optional[torch.Tensor], x: torch.Tensor):
    """(mode, fp32 scale tensor, row length) for a per-tensor or per-row (dim 0) scale."""
    if scale is None:
        return 0, None, 1
    s = scale.to(device=x.device, dtype=torch.float32)
    if s.numel() == 1:
        return 1, s.reshape(1), 1
    rows = x.shape[0] if x.dim() > 0 else 1
    if s.numel() != rows:
        raise ValueError(f"scale must have 1 or {rows} (= x.shape[0]) elements; got shape {tuple(scale.shape)}")
    return 2, s.reshape(rows).contiguous(), max(1, x.numel() // rows)


CPU_BLOCK = 1 << 16  # the interpreter runs one numpy op per Triton op: fewer, bigger blocks


def _launch_1d(kernel, n, block, warps, args, consts):
    dev = args[0].device.type
    if dev != "cuda":
        block = max(block, min(next_pow2(n), CPU_BLOCK))
    big = n + block >= 2 ** 31
    grid = (cdiv(n, block),)
    k = launchable(kernel, dev)
    if dev == "cuda":
        kw = dict(consts, BLOCK=block, BIG=big, num_warps=warps)
        # later launches of the same kind skip Triton's dispatch (kernels/fast_launch.py): 30-45 us of host
        # time each, 231 decodes a Flux step with both nodes, a step the GPU then waited for (2026-11-28)
        launch_kernel(k, grid, *args, plan=fast_launch.args_key(args, kw), **kw)
    else:
        with wrapping_int_math():
            k[grid](*args, **consts, BLOCK=block, BIG=big)


def decode(x: torch.Tensor, dtype: torch.dtype = torch.bfloat16, scale: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None, round_scale: bool = False) -> torch.Tensor:
    """fp8 tensor (float8_e4m3fn / float8_e5m2) -> ``dtype``, times an optional per-tensor or
    per-row (dim 0) scale (rounded to ``dtype`` first with ``round_scale``). Runs the Triton
    kernel directly (CUDA, or the interpreter on CPU)."""
    if x.dtype not in _FMT:
        raise TypeError(f"decode() needs a float8_e4m3fn or float8_e5m2 tensor, got {x.dtype}")
    if dtype not in _OUT:
        raise TypeError(f"decode() writes float32, float16 or bfloat16, not {dtype}")
    x = x.contiguous()
    mode, s, C = _scale_mode(scale, x)
    if out is None:
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor of x's shape and the requested dtype")
    n = x.numel()
    LAUNCHES["decode"] += 1
    if n == 0:
        return out
    bits = out.view(_BITS_VIEW[dtype])
    xb = x.view(torch.uint8)
    _launch_1d(fp8_decode_kernel, n, DECODE_BLOCK, DECODE_WARPS,
               (xb, bits, s if s is not None else xb, n, C),
               dict(FMT=_FMT[x.dtype], OUT=_OUT[dtype], SCALE=mode, ROUND_SCALE=bool(round_scale and mode)))
    return out


# The decode variants a model's weights launch, compiled ahead (:func:`warm_decode`):
# (fp8 dtype, output dtype, per-tensor scale?, round_scale?, numel a multiple of 16?)
WARM_ENV = "TRITONKIT_WARM_DECODE"


def warm_decode(device: torch.device, variants) -> Optional[object]:
    """Compiles the decode kernel ahead, in the background (kernels/prepare.py), for each variant of
    ``variants`` (see above) as a contiguous weight of that kind launches it; the kernels.prepare.Prepared
    of those compiles, or None where nothing compiles ahead (not CUDA, a Triton without asynchronous
    compiles, ``TRITONKIT_WARM_DECODE=0``). Below sm89 every fp8 layer's first calls run decode +
    matmul while their candidates compile (nodes/calibration.py), so the model's first step waited for
    this kernel's compile (and its launcher) in its thread: 0.7 s of an H100's cold first step with
    compile workers (cProfile, 2026-11-26). Started when the model is patched, it compiles while the
    model loads. Triton specializes the launch on its integer arguments being multiples of 16 and on
    16-byte-aligned pointers: a 16- or 17-element tensor stands for the weight."""
    import os
    from . import prepare
    if os.environ.get(WARM_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if torch.device(device).type != "cuda" or not prepare.available():
        return None
    fns = {v: functools.partial(_warm_one, torch.device(device), *v) for v in sorted(set(variants), key=str)}
    return prepare.prepare(fns) if fns else None


def _warm_one(device, fp8_dtype, dtype, scaled, round_scale, mult16) -> None:
    x = torch.zeros(16 if mult16 else 17, dtype=torch.uint8, device=device).view(fp8_dtype)
    s = torch.ones(1, dtype=torch.float32, device=device) if scaled else None
    n = LAUNCHES["decode"]
    try:
        decode(x, dtype, s, round_scale=bool(round_scale and scaled))  # compiles only (a preparing run)
    finally:
        LAUNCHES["decode"] = n  # nothing ran


def encode(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn, scale: Optional[torch.Tensor] = None,
           saturate: Optional[bool] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32/fp16/bf16 -> fp8 of ``x / scale`` with round-to-nearest-even. ``saturate=None``
    follows the installed torch (see the module docstring)."""
    if fp8_dtype not in _FMT:
        raise TypeError(f"encode() writes float8_e4m3fn or float8_e5m2, not {fp8_dtype}")
    if x.dtype not in _OUT:
        raise TypeError(f"encode() reads float32, float16 or bfloat16, not {x.dtype}")
    if saturate is None:
        saturate = fp8_dtype == torch.float8_e4m3fn and torch_saturates_e4m3fn()
    x = x.contiguous()
    mode, s, C = _scale_mode(scale, x)
    if out is None:
        out = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != fp8_dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor of x's shape and the requested fp8 dtype")
    n = x.numel()
    LAUNCHES["encode"] += 1
    if n == 0:
        return out
    ob = out.view(torch.uint8)
    xb = x.view(_BITS_VIEW[x.dtype])
    _launch_1d(fp8_encode_kernel, n, ENCODE_BLOCK, ENCODE_WARPS,
               (xb, ob, s if s is not None else xb, n, C),
               dict(FMT=_FMT[fp8_dtype], IN=_OUT[x.dtype], SCALE=mode, SATURATE=bool(saturate)))
    return out


# ----------------------------------------------------------------------------- torch references
def decode_reference(x: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                     scale: Optional[torch.Tensor] = None, round_scale: bool = False) -> torch.Tensor:
    """What :func:`decode` computes, in torch: ``x.to(dtype)``, or ``(x.float() * s).to(dtype)``
    (``s`` rounded to ``dtype`` first with ``round_scale``)."""
    if scale is None:
        return x.to(dtype)
    s = scale.to(device=x.device, dtype=dtype if round_scale else torch.float32).to(torch.float32)
    if s.numel() > 1:
        s = s.reshape((x.shape[0],) + (1,) * (x.dim() - 1))
    return (x.to(torch.float32) * s).to(dtype)


def encode_reference(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                     scale: Optional[torch.Tensor] = None, saturate: Optional[bool] = None) -> torch.Tensor:
    """What :func:`encode` computes: torch's cast when ``saturate`` is what this torch does, else
    the same C++ algorithm written with torch integer ops (both overflow policies)."""
    v = x.to(torch.float32)
    if scale is not None:
        s = scale.to(device=x.device, dtype=torch.float32)
        if s.numel() > 1:
            s = s.reshape((x.shape[0],) + (1,) * (x.dim() - 1))
        v = v / s
    native_sat = fp8_dtype == torch.float8_e4m3fn and torch_saturates_e4m3fn()
    if saturate is None or bool(saturate) == native_sat:
        return v.to(fp8_dtype)
    return _encode_bits_torch(v, fp8_dtype, bool(saturate)).view(fp8_dtype)


def _encode_bits_torch(v: torch.Tensor, fp8_dtype: torch.dtype, saturate: bool) -> torch.Tensor:
    u = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (u >> 24) & 0x80
    f = u & 0x7FFFFFFF
    fv = f.to(torch.int32).view(torch.float32)
    if fp8_dtype == torch.float8_e4m3fn:
        dn = ((fv + 16384.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF) - (141 << 23)
        nm = ((f - (120 << 23) + 0x7FFFF + ((f >> 20) & 1)) >> 20) & 0xFF
        r = torch.where(f < (121 << 23), dn, nm)
        if saturate:
            r = torch.where(r == 0x7F, 0x7E, r)
            r = torch.where(f >= (1087 << 20), torch.where(f > 0x7F800000, 0x7F, 0x7E), r)
        else:
            r = torch.where(f >= (1087 << 20), 0x7F, r)
    else:
        dn = ((fv + 128.0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF) - (134 << 23)
        nm = ((f - (112 << 23) + 0xFFFFF + ((f >> 21) & 1)) >> 21) & 0xFF
        r = torch.where(f < (113 << 23), dn, nm)
        if saturate:
            r = torch.where(r >= 0x7C, 0x7B, r)
            r = torch.where(f >= (143 << 23), torch.where(f > 0x7F800000, 0x7F, 0x7B), r)
        else:
            r = torch.where(f >= (143 << 23), torch.where(f > 0x7F800000, 0x7F, 0x7C), r)
    return (r | sign).to(torch.uint8)


# ----------------------------------------------------------------------------- custom ops
def _define_ops():
    """Defines ``tritonkit::fp8_decode`` and ``tritonkit::fp8_encode`` once per process (a second
    import of the pack under another module name reuses the first definition)."""
    if not op_exists("fp8_decode"):
        @torch.library.custom_op(f"{OP_NAMESPACE}::fp8_decode", mutates_args=())
        def fp8_decode(x: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype,
                       round_scale: bool = False) -> torch.Tensor:
            return decode(x, dtype, scale, round_scale=round_scale)

        @fp8_decode.register_fake
        def _(x, scale, dtype, round_scale=False):
            return torch.empty(x.shape, dtype=dtype, device=x.device)

    if not op_exists("fp8_encode"):
        @torch.library.custom_op(f"{OP_NAMESPACE}::fp8_encode", mutates_args=())
        def fp8_encode(x: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype,
                       saturate: int = -1) -> torch.Tensor:
            return encode(x, dtype, scale, None if saturate < 0 else bool(saturate))

        @fp8_encode.register_fake
        def _(x, scale, dtype, saturate=-1):
            return torch.empty(x.shape, dtype=dtype, device=x.device)


_define_ops()


def decode_op(x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor] = None,
              round_scale: bool = False) -> torch.Tensor:
    """:func:`decode` through the custom op (what model code should call: compile-safe). Eager
    calls on plain tensors skip the dispatcher (``runtime.eager_plain``)."""
    if eager_plain(x):
        return decode(x, dtype, scale, round_scale=round_scale)
    return torch.ops.tritonkit.fp8_decode(x, scale, dtype, round_scale)


def encode_op(x: torch.Tensor, fp8_dtype: torch.dtype, scale: Optional[torch.Tensor] = None,
              saturate: Optional[bool] = None) -> torch.Tensor:
    if eager_plain(x):
        return encode(x, fp8_dtype, scale, saturate=saturate)
    return torch.ops.tritonkit.fp8_encode(x, scale, fp8_dtype, -1 if saturate is None else int(saturate))


# ----------------------------------------------------------------------------- cross-compile specs
def _dspec(out_ty, scale, fmt, out, scale_mode, round_scale=False):
    return (fp8_decode_kernel,
            {"x_ptr": "*u8", "out_ptr": out_ty, "scale_ptr": scale, "n": "i32", "C": "i32",
             "FMT": "constexpr", "OUT": "constexpr", "SCALE": "constexpr", "BLOCK": "constexpr", "BIG": "constexpr",
             "ROUND_SCALE": "constexpr"},
            {"FMT": fmt, "OUT": out, "SCALE": scale_mode, "BLOCK": DECODE_BLOCK, "BIG": False,
             "ROUND_SCALE": round_scale})


def _espec(in_ty, fmt, inp, scale_mode, sat):
    return (fp8_encode_kernel,
            {"x_ptr": in_ty, "out_ptr": "*u8", "scale_ptr": "*fp32", "n": "i32", "C": "i32",
             "FMT": "constexpr", "IN": "constexpr", "SCALE": "constexpr", "SATURATE": "constexpr",
             "BLOCK": "constexpr", "BIG": "constexpr"},
            {"FMT": fmt, "IN": inp, "SCALE": scale_mode, "SATURATE": sat, "BLOCK": ENCODE_BLOCK, "BIG": False})


COMPILE_SPECS = [
    _dspec("*i16", "*u8", 0, 2, 0),     # e4m3fn -> bf16 (ComfyUI's cast on Ampere)
    _dspec("*i16", "*fp32", 0, 1, 1),   # e4m3fn -> fp16, per-tensor scale (scaled fp8 on Turing)
    _dspec("*i32", "*fp32", 1, 0, 2),   # e5m2 -> fp32, per-row scale
    _dspec("*i16", "*fp32", 0, 2, 1, True),  # e4m3fn -> bf16, scale rounded to bf16 (ComfyUI 0.8 QuantizedTensor)
    _espec("*i16", 0, 2, 0, True),      # bf16 -> e4m3fn, saturating
    _espec("*i32", 1, 0, 1, False),     # fp32 -> e5m2 with a scale
]
