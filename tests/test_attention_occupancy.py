"""bench/attention_occupancy.py's occupancy arithmetic, against what the H200's driver reported for the same kernels
(forty-eighth session) and what a 100 KB-an-SM card allows."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import attention_occupancy as O  # noqa: E402

KB = 1024


def test_ctas_per_sm_on_a_geforce_card_and_on_the_h200():
    card, h200 = 100 * KB, 228 * KB
    # the sm89 builds of the @89 8-bit kernel (fp8 P·V, head 128): (64, 64, 4, 3) two CTAs on a 4090, (64, 128, 4, 3)
    # one, (64, 128, 4, 2) two (its 49 KB and the driver's 1 KB a CTA fill the 100 KB to within 2 KB)
    assert O.ctas_per_sm(45072, 244, 4, card) == 2
    assert O.ctas_per_sm(81936, 255, 4, card) == 1
    assert O.ctas_per_sm(49168, 255, 4, card) == 2
    # the sm90 builds the H200 runs: two CTAs each, the registers' limit (the driver's calculator said 2 for both)
    assert O.ctas_per_sm(58368, 234, 4, h200) == 2
    assert O.ctas_per_sm(107520, 255, 4, h200) == 2
    # raised to 232448 bytes, one (what the bench launches to match the card)
    assert O.ctas_per_sm(232448, 255, 4, h200) == 1
    # 8 warps at 224 registers: one CTA by registers wherever the shared memory would allow two
    assert O.ctas_per_sm(49160, 224, 8, card) == 1
    # a small kernel is held by the threads an SM allows
    assert O.ctas_per_sm(1024, 32, 4, h200, max_threads=1536) == 12
