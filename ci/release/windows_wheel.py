"""Pack the win_amd64 wheels (the release workflow's `windows` job): for each x86_64 stable-ABI wheel
given, the same wheel with the MSVC-built binding (buildtool/builder/windows_wheel.py); other wheels
are passed over, each named. Exit 1 if no wheel could be packed or a packing failed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from buildtool.builder.windows_wheel import WindowsWheelError, windows_wheel
from buildtool.core.wheel_file import WheelDirError, read_manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binding", type=Path, required=True, help="the DLL ci/release/msvc_binding.py built")
    ap.add_argument("--out", type=Path, required=True, help="where to write the win_amd64 wheels")
    ap.add_argument("wheels", type=Path, nargs="+", help="the x86_64 build jobs' wheels")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    made = 0
    for wheel in args.wheels:
        try:
            info = read_manifest(wheel).info
        except WheelDirError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if info.binding_form != "stable" or info.platform != "x86_64" or info.all_wheel:
            print(f"passed over {wheel.name} (not an x86_64 stable-ABI wheel)")
            continue
        try:
            print(f"wrote {windows_wheel(wheel, args.binding, args.out)}")
        except WindowsWheelError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        made += 1
    if not made:
        print("error: no x86_64 stable-ABI wheel among those given", file=sys.stderr)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
