"""``training.dtype=auto`` on a CPU (auralm.training.precision): bf16 only where the CPU has AMX, and the choice said in
the run's first lines with its reason. The CPU's flags are given (a /proc/cpuinfo written here), so the verdict does
not depend on the machine the suite runs on."""

from __future__ import annotations

import pytest
import torch

from auralm.training import config, precision

CPU = torch.device("cpu")


@pytest.fixture
def flags(monkeypatch):
    def use(*names: str) -> None:
        monkeypatch.setattr(precision, "_cpu_flags", lambda: ["fpu", "sse2", "avx2", *names])
    return use


def _training(dtype: str) -> config.TrainingConfig:
    t = config.Config().training
    t.dtype = dtype
    return t


@pytest.mark.parametrize("cpu_flags, bf16, said", [
    ((), False, "fp32 (training.dtype=auto: this CPU has no native bf16; training.dtype=bf16 to try it)"),
    (("avx512f", "avx512_bf16"), False, "fp32 (training.dtype=auto: this CPU has AVX512-BF16 but no AMX, where bf16 "
                                        "is slower here; training.dtype=bf16 to try it)"),
    (("avx512_bf16", "amx_tile", "amx_bf16"), True, "bf16 (training.dtype=auto: this CPU has AMX)"),
], ids=["avx2", "avx512-bf16", "amx"])
def test_auto_is_bf16_only_with_amx_and_says_why(flags, cpu_flags, bf16, said):
    flags(*cpu_flags)
    t = _training("auto")
    assert precision.bf16_compute(t, CPU) is bf16
    assert precision.precision_said(t, CPU) == said
    assert isinstance(precision.autocast(t, CPU), torch.autocast) is bf16


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_dtype_given_is_used_and_said_as_given(flags, dtype):
    flags()  # no native bf16: a bf16 asked for is still bf16
    t = _training(dtype)
    assert precision.bf16_compute(t, CPU) is (dtype == "bf16")
    assert precision.precision_said(t, CPU) == f"{dtype} (training.dtype={dtype})"

