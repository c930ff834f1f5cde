import pytest
import torch

from compile_utils import ARCHS, compile_for
from tritonkit.kernels import vector_add


@pytest.mark.parametrize("n", [1, 1023, 1024, 1025, 98_432])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_cpu_matches_torch(n, dtype, poison):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g).to(dtype)
    y = torch.randn(n, generator=g).to(dtype)
    out = poison(torch.empty_like(x))
    vector_add.add(x, y, out=out)
    ref = (x.double() + y.double()).to(dtype)
    assert torch.equal(out, ref)


def test_add_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="one shape"):
        vector_add.add(torch.zeros(3), torch.zeros(4))


@pytest.mark.parametrize("cc", ARCHS)
@pytest.mark.parametrize("spec", range(len(vector_add.COMPILE_SPECS)))
def test_vector_add_compiles_for_every_arch(cc, spec):
    kernel, sig, consts = vector_add.COMPILE_SPECS[spec]
    k = compile_for(kernel, sig, consts, cc)
    assert len(k.asm["cubin"]) > 0
    assert f"sm_{cc}" in k.asm["ptx"]


@pytest.mark.gpu
def test_add_cuda_matches_torch(poison):
    x = torch.rand(98_432, device="cuda")
    y = torch.rand(98_432, device="cuda")
    out = poison(torch.empty_like(x))
    vector_add.add(x, y, out=out)
    assert torch.equal(out, x + y)
