"""Half-precision casts name what they lose at the small end (``gather/precision_loss.py``): values that become 0 or
subnormal are counted; many of them refuse the cast, a few that become 0 are a warning; the fix named is bfloat16."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_zerocopy.gather.host_table import FeatureOverflowError, cast_rows_into, check_fits_dtype
from lightning_zerocopy.gather.precision_loss import FeatureUnderflowError, PrecisionLoss


def test_features_that_all_underflow_in_float16_are_refused_with_the_count_and_the_fix() -> None:
    x = torch.rand(300, 8) * 1e-9 + 1e-10  # every value below float16's smallest subnormal (6e-8)
    with pytest.raises(FeatureUnderflowError) as info:
        cast_rows_into(x, torch.empty(300, 8, dtype=torch.float16), key="data.init_args.feature_dtype")
    message = str(info.value)
    assert "2,400 of 2,400 nonzero values (100.00%) become 0 or subnormal (below 6.1e-05) in float16" in message, message
    assert "node 0, column 0" in message and "set data.init_args.feature_dtype to bfloat16" in message
    assert info.value.loss.zeroed == 2400 and "\n" not in message
    assert torch.equal(cast_rows_into(x, torch.empty(300, 8, dtype=torch.bfloat16)), x.to(torch.bfloat16))


def test_subnormal_values_count_as_lost_and_a_few_zeroed_ones_are_a_warning() -> None:
    gen = torch.Generator().manual_seed(0)  # unseeded, a normal draw below float16's 6.1e-05 came ~1 run in 3
    x = torch.randn(1000, 10, generator=gen)
    assert x.abs().min() > 6.2e-5  # only the values set below are small
    x[:, 0] = 1e-6  # subnormal in float16 (kept with fewer bits): 10 % of the values
    with pytest.raises(FeatureUnderflowError, match=r"1,000 of 10,000 nonzero values \(10.00%\)"):
        cast_rows_into(x, torch.empty(1000, 10, dtype=torch.float16), key="k")
    x[:, 0] = torch.randn(1000, generator=gen)
    assert x.abs().min() > 6.2e-5
    x[17, 3] = 1e-9  # one value becomes 0: warned, cast kept
    with pytest.warns(UserWarning, match=r"1 of 10,000 nonzero values \(0.01%\) become 0 in float16 \(e.g. 1e-09 at "
                                         r"node 17, column 3\); set k to bfloat16"):  # fmt: skip
        out = cast_rows_into(x, torch.empty(1000, 10, dtype=torch.float16), key="k")
    assert out[17, 3] == 0 and out[16, 3] == x[16, 3].to(torch.float16)


def test_a_gaussian_table_casts_to_float16_without_a_word() -> None:
    x = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast_rows_into(x, torch.empty(2000, 16, dtype=torch.float16))


def test_check_fits_dtype_checks_a_later_cast_as_the_table_cast_is_checked() -> None:
    x = torch.randn(500, 4)
    check_fits_dtype(x, torch.float16, "features", "data.init_args.x_dtype")
    x[123, 1] = 1e5
    with pytest.raises(FeatureOverflowError, match=r"node 123, column 1 does not fit float16.*data\.init_args\.x_dtype"):
        check_fits_dtype(x, torch.float16, "features", "data.init_args.x_dtype")
    check_fits_dtype(x, torch.bfloat16, "features", "data.init_args.x_dtype")  # float32's range
    with pytest.raises(FeatureUnderflowError, match="set data.init_args.x_dtype to bfloat16"):
        check_fits_dtype(torch.full((40, 3), 3e-9), torch.float16, "features", "data.init_args.x_dtype")


def test_counts_add_up_over_chunks() -> None:
    loss = PrecisionLoss()
    src = torch.tensor([[1e-9, 1.0], [0.0, 1e-6]])
    loss.count(src, src.to(torch.float16), first_row=40)
    assert (loss.nonzero, loss.zeroed, loss.subnormal, loss.first) == (3, 1, 1, (40, 0, pytest.approx(1e-9)))
    loss.count(src, src.to(torch.float16), first_row=42)
    assert (loss.nonzero, loss.zeroed, loss.subnormal, loss.first[0]) == (6, 2, 2, 40)
