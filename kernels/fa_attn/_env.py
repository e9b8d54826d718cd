"""fa_attn's switches in the environment (FA_STRICT, FA_CHECK_INDICES, FA_SELF_CHECK, FA_ROUTE), read live
by the calls that need one, so setting one in the process (os.environ[...] = ..., pytest's
monkeypatch.setenv) takes effect at the next call, as the docs say.

os.environ.get costs about 1 µs for a name that is not set (Mapping.get raises and catches KeyError
twice), several times that between a decode step's torch calls: more than the step's budget allows per
switch (issue 26). `reader` answers from the dict in which os.environ keeps its values
(os._Environ._data, keys made by its encodekey), which os.environ's own methods read and write, so the
answer is os.environ.get's; where CPython's internals differ, or os.environ was replaced by another
mapping, it asks os.environ.get.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_ENVIRON = os.environ
_DATA = getattr(_ENVIRON, "_data", None)
_ENCODE = getattr(_ENVIRON, "encodekey", None)
_DECODE = getattr(_ENVIRON, "decodevalue", None)


def reader(name: str) -> Callable[[], str]:
    """A function that returns os.environ.get(name, "") at each call."""

    def slow() -> str:
        return os.environ.get(name, "")

    if not (isinstance(_DATA, dict) and callable(_ENCODE) and callable(_DECODE)):
        return slow
    key = _ENCODE(name)

    def read() -> str:
        if os.environ is not _ENVIRON:
            return slow()
        value = _DATA.get(key)
        return "" if value is None else _DECODE(value)

    return read


# How a switch is spelled on and off (case and surrounding blanks aside); unset is off.
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def switch(name: str) -> Callable[[], bool]:
    """A function that says at each call whether the switch `name` is on: 1/true/yes/on, or off:
    unset, 0/false/no/off. Any other value raises ValueError naming the variable and the spellings
    (FA_STRICT=false turned strict mode on when any non-empty value but "0" did)."""
    read = reader(name)

    def on() -> bool:
        value = read()
        if value in _OFF:  # unset: the common case, answered first
            return False
        if value in _ON:
            return True
        word = value.strip().lower()
        if word in _ON or word in _OFF:
            return word in _ON
        raise ValueError(
            f"{name}={value!r}: use 1, true, yes or on to turn it on; 0, false, no or off (or unset it) "
            "to turn it off"
        )

    return on
