"""The GPU architecture the nodes choose their paths for: the CUDA device's compute capability,
or ``TRITONKIT_FORCE_ARCH`` (e.g. ``86``) so a newer GPU can be made to behave like an older one
(tests and benchmarks of the sm<89 paths on an H100/H200). No Triton import: the nodes must
register without a working Triton."""
from __future__ import annotations

import os
from typing import Optional

import torch

try:
    from ..kernels.device import capability
except ImportError:  # this file loaded on its own (bench/workflow.py reads CUDNN_SDPA_ARCHS from it)
    def capability(device):
        major, minor = torch.cuda.get_device_capability(device)
        return major * 10 + minor

ARCH_ENV = "TRITONKIT_FORCE_ARCH"

# Where torch's SDPA prefers its cuDNN backend (check_prefer_cudnn_attention in torch's
# sdp_utils.cpp: the datacenter parts sm90 and sm100/103); everywhere else, GeForce cards
# included, it runs FlashAttention-2 first (memory-efficient attention on sm75).
CUDNN_SDPA_ARCHS = (90, 100, 103)


def parse_arch(value: str) -> Optional[int]:
    """'86', 'sm86', 'sm_86', '8.6' -> 86; '' -> None."""
    v = value.strip().lower().replace("sm_", "").replace("sm", "")
    if not v:
        return None
    if "." in v:
        major, minor = v.split(".", 1)
        return int(major) * 10 + int(minor)
    return int(v)


# Triton's own switch (read when it compiles; part of its on-disk cache key): no wgmma (MMAv3) for tl.dot on
# sm90+, the ``mma.sync`` an sm8x / sm120 card's Triton emits instead.
MMA_V3_ENV = "DISABLE_MMA_V3"


def card_mma(arch: Optional[int], environ) -> Optional[str]:
    """For a GPU of ``arch`` simulated on a newer one: below 90, have Triton compile ``tl.dot`` as that card's
    Triton must, with ``mma.sync`` instead of Hopper's wgmma (``DISABLE_MMA_V3=1`` in ``environ``), unless
    ``environ`` already says either way. Returns the value it set, or None. On an H200 the simulated sm86 path's
    8-bit pick ran 6.09 ms a call at HunyuanVideo's shape as wgmma code and 8.66 as mma.sync, against FA2's 9.35
    (BENCHMARKS.md, forty-ninth session): a card without wgmma is only simulated with its instructions. For the
    whole process, set before its first compile: Triton keys its in-memory kernels without this variable, and
    compile workers keep the environment they start with."""
    if arch is None or arch >= 90 or MMA_V3_ENV in environ:
        return None
    environ[MMA_V3_ENV] = "1"
    return "1"


def card_instructions(environ) -> Optional[str]:
    """:func:`card_mma` for ``TRITONKIT_FORCE_ARCH``'s arch, where ``environ`` sets one (the pack at load)."""
    try:
        arch = parse_arch(environ.get(ARCH_ENV, ""))
    except ValueError:
        return None  # effective_arch's callers report a bad value
    return card_mma(arch, environ)


def arch_forced() -> bool:
    return bool(os.environ.get(ARCH_ENV, "").strip())


def effective_arch(device) -> Optional[int]:
    """Compute capability as an int (86 for sm86), from ``TRITONKIT_FORCE_ARCH`` when set, else
    from the CUDA device; None for a non-CUDA device."""
    if arch_forced():
        return parse_arch(os.environ[ARCH_ENV])
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return capability(dev)  # cached: a constant in traced code, not a graph op
