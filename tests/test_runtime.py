"""kernels/runtime.py's host helpers: the plain cdiv / next_pow2 the launchers use instead of
Triton's constexpr functions agree with Triton's on every value a launcher passes; eager_plain
lets only eager calls on plain CPU / CUDA tensors skip the custom ops."""
import torch
import triton

from tritonkit.kernels.runtime import cdiv, eager_plain, next_pow2


def test_cdiv_and_next_pow2_match_tritons():
    values = list(range(0, 4200)) + [2**k + d for k in range(12, 40) for d in (-1, 0, 1)]
    for n in values:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 128, 1000):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_eager_plain_is_only_for_plain_eager_tensors():
    assert eager_plain(torch.zeros(2, dtype=torch.float8_e4m3fn))
    assert not eager_plain(torch.empty(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not eager_plain(torch.empty(2))


def test_interpreted_launches_from_several_threads_are_serialized():
    # the Triton interpreter patches triton.language while a kernel runs: without the lock a
    # second thread's launch fails ("Did you forget to add @triton.jit?")
    from thread_utils import run_in_threads
    from tritonkit.kernels import vector_add

    def one(i):
        x = torch.rand(4099 + i)
        y = torch.rand(4099 + i)
        out = torch.full_like(x, float("nan"))
        vector_add.add(x, y, out=out)
        return torch.equal(out, x + y)

    results, errors = run_in_threads(one)
    assert not errors, errors
    assert results == [True] * 4
