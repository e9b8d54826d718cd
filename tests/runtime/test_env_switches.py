"""fa_attn's on/off switches (FA_STRICT, FA_CHECK_INDICES) as people spell them: FA_STRICT=false, off
or no turned strict mode on (anything but "" and "0" did), now off; a value that is neither says so."""

from __future__ import annotations

import fa_attn
import pytest
import torch
from fa_attn.runtime import dispatch


def _small() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(1, 3, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)


@pytest.mark.parametrize("value", ["", "0", "false", "off", "no", " False ", "OFF"])
def test_off_spellings_leave_strict_mode_off(monkeypatch, value):
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setenv("FA_STRICT", value)
    with pytest.warns(fa_attn.FaFallbackWarning, match="device-not-cuda"):
        fa_attn.flash_attn_func(*_small())  # a CPU call falls back: a warning, not an error


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", " TRUE", "On"])
def test_on_spellings_turn_strict_mode_on(monkeypatch, value):
    monkeypatch.setenv("FA_STRICT", value)
    with pytest.raises(fa_attn.FaFallbackError, match="device-not-cuda"):
        fa_attn.flash_attn_func(*_small())


@pytest.mark.parametrize("value", ["2", "maybe", "strict"])
def test_another_value_names_the_switch_and_the_spellings(monkeypatch, value):
    monkeypatch.setenv("FA_STRICT", value)
    with pytest.raises(ValueError, match=f"FA_STRICT='{value}': use 1, true, yes or on"):
        fa_attn.flash_attn_func(*_small())
