"""The win_amd64 wheel of a stable-ABI variant: the Linux x86_64 wheel's runtime, cubins and PTX with a
binding MSVC built on Windows in place of the Linux one.

The cubins and PTX are device code: the same bytes whatever OS the host runs, so they are taken from
the Linux wheel rather than compiled again. Only the binding differs, and it must come from MSVC: the
stable C ABI carries C++ exceptions out of `extern "C"` functions into torch's dispatcher, which works
only with torch's own C++ runtime and exception model (a MinGW or zig build loads but aborts the
process at its first failed check). Only the stable form is made for Windows: one binding serves every
torch from its floor on, so one MSVC build per release serves every CUDA major's wheel.

The release workflow's `windows` job builds the DLL (ci/release/msvc_binding.py) and calls this
(ci/release/windows_wheel.py). Not run on Windows here: the tests feed it a PE header, not a binding.
"""

from __future__ import annotations

import dataclasses
import struct
import zipfile
from pathlib import Path

from buildtool.builder import package
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import read_manifest
from buildtool.errors import FaError

TAG = "win_amd64"
BINDING_FILE = "fa_attn_ops.dll"  # the Windows binding, inside fa_attn/ (torch.ops.load_library takes it)
_AMD64 = 0x8664  # IMAGE_FILE_MACHINE_AMD64 in a PE file's COFF header


class WindowsWheelError(FaError):
    """A Linux wheel that has no Windows counterpart, or a file that is not an x86_64 Windows DLL."""


def check_dll(path: Path) -> None:
    """An x86_64 PE image (MZ header, PE signature, AMD64 machine), or WindowsWheelError naming what is
    wrong: a Linux .so or a 32-bit DLL would be packed and only fail on the user's machine."""
    try:
        head = path.read_bytes()[:4096]
    except OSError as e:
        raise WindowsWheelError(f"{path}: cannot read the binding ({e.strerror})") from e
    if head[:2] != b"MZ" or len(head) < 0x40:
        raise WindowsWheelError(f"{path}: not a Windows DLL (no MZ header); pass the DLL MSVC built")
    (pe,) = struct.unpack_from("<I", head, 0x3C)
    if head[pe : pe + 4] != b"PE\0\0" or len(head) < pe + 6:
        raise WindowsWheelError(f"{path}: not a Windows DLL (no PE signature); pass the DLL MSVC built")
    (machine,) = struct.unpack_from("<H", head, pe + 4)
    if machine != _AMD64:
        raise WindowsWheelError(f"{path}: a DLL for machine 0x{machine:04x}, not x86_64 (0x8664)")


def windows_wheel(linux_wheel: Path, dll: Path, out_dir: Path) -> Path:
    """Write the win_amd64 wheel of `linux_wheel` (a stable-ABI x86_64 wheel) with `dll` as its binding
    into `out_dir`; the same version and variant, so a variant's index lists both and pip takes the one
    whose tag fits."""
    man = read_manifest(linux_wheel)
    info = man.info
    if info.binding_form != "stable" or info.platform != "x86_64" or info.all_wheel or not info.binding:
        raise WindowsWheelError(
            f"{linux_wheel}: a {info.binding_form or 'universal'} wheel for {info.platform}; Windows wheels "
            "are made from the x86_64 stable-ABI wheels (cu12torch2.10plus) only"
        )
    check_dll(dll)
    dist_info = f"{schema.DIST}-{info.version}.dist-info/"
    linux_binding = f"{schema.DIST}/{info.binding}"
    with zipfile.ZipFile(linux_wheel) as zf:
        files = {
            n: zf.read(n)
            for n in zf.namelist()
            if not n.startswith(dist_info)
            and n not in (schema.MANIFEST_PATH, linux_binding)
            and not n.endswith("/")
        }
    files[f"{schema.DIST}/{BINDING_FILE}"] = dll.read_bytes()
    windows = dataclasses.replace(man, info=dataclasses.replace(info, binding=BINDING_FILE))
    return package.write_wheel(files, windows, info.version, TAG, out_dir)
