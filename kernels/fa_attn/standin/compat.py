"""Opt-in `flash_attn` compatibility (the stand-in itself is _standin.py, whose docstring says what it
gives and what transformers checks), and its command line:

    python -m fa_attn.flash_attn_compat [--status] (script.py | -m module) [args...]

runs a script or module with the stand-in installed. fa_attn's __init__ imports _standin, not this
module, so runpy finds this one unimported and runs it without a warning.
"""

from __future__ import annotations

import runpy
import sys

from .install import (
    FLASH_ATTN_API,
    SHIM_VERSION,
    FlashAttnStatus,
    flash_attn_status,
    install_as_flash_attn,
    not_provided,
    uninstall_as_flash_attn,
)

__all__ = [
    "FLASH_ATTN_API",
    "SHIM_VERSION",
    "FlashAttnStatus",
    "flash_attn_status",
    "install_as_flash_attn",
    "main",
    "not_provided",
    "uninstall_as_flash_attn",
]


def main(argv: list[str] | None = None) -> int:
    """python -m fa_attn.flash_attn_compat [--status] (script.py | -m module) [args...]"""
    args = list(sys.argv[1:] if argv is None else argv)
    status = install_as_flash_attn()
    if not args or args[0] == "--status":
        print(status.message)
        return 0
    print(f"fa_attn.flash_attn_compat: {status.message}", file=sys.stderr)
    if args[0] == "-m" and len(args) > 1:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
