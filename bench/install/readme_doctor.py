"""README's sample of what README's first command prints on a machine without an NVIDIA GPU: doctor's
answer (the first paragraph of `fa doctor` at 80 columns), from a real run on a folder of wheels
`fa build --matrix matrix.yaml --platform x86_64` wrote, on this machine (probed: no GPU here).

    python bench/install/readme_doctor.py --wheels wheels            # print the sample
    python bench/install/readme_doctor.py --wheels wheels --record   # write it into README.md (section doctor-no-gpu)

The folder's own path in the pip line is shown as CHECKOUT (README's reader has their own). With
--record the probe of this machine is kept in docs/readme-doctor-machine.json, so that
tests/ci/test_readme_doctor.py can ask doctor again for the same machine (on the index fixture shaped
like the release's) and fail when README's sample is no longer what doctor prints. Writes only README.md
and that file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MACHINE = REPO / "docs" / "readme-doctor-machine.json"
SECTION = "doctor-no-gpu"
CHECKOUT = "file:///home/you/fa/wheels"  # what the folder's own file URL is shown as


def run_fa(*args: str) -> subprocess.CompletedProcess[str]:
    """`fa ARGS` from this checkout at 80 columns, as README's reader's terminal shows it."""
    paths = os.pathsep.join([str(REPO), str(REPO / "kernels")])
    command = [sys.executable, "-m", "buildtool.cli", *args]
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": paths}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False)


def answer(stdout: str, wheels: Path) -> str:
    """Doctor's answer as README shows it: its first paragraph, the folder's URL as CHECKOUT's."""
    first = stdout.split("\n\n", 1)[0].rstrip("\n")
    return first.replace(wheels.resolve().as_uri(), CHECKOUT)


def section(text: str, exit_code: int) -> str:
    return "\n".join(
        [
            f"On a machine without an NVIDIA GPU the first command ends with doctor's answer (exit {exit_code});",
            "its first paragraph:",
            "",
            "```text recorded",
            text,
            "```",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, required=True, help="the folder fa build wrote")
    parser.add_argument("--record", action="store_true", help="write the sample into README.md")
    args = parser.parse_args()
    if not (args.wheels / "index.json").is_file():
        raise SystemExit(f"--wheels {args.wheels}: no index.json (fix: pass the folder fa build wrote)")
    probe = run_fa("probe", "--json")
    if probe.returncode != 0:
        raise SystemExit(f"fa probe --json failed:\n{probe.stderr}")
    if '"gpus": []' not in probe.stdout:
        raise SystemExit("this machine has an NVIDIA GPU: README's sample is for a machine without one")
    doctor = run_fa("doctor", "--wheels", str(args.wheels.resolve()))
    body = section(answer(doctor.stdout, args.wheels), doctor.returncode)
    print(body)
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))
        from figures import record  # bench/figures.py

        from buildtool.core import atomic

        atomic.write_text(MACHINE, probe.stdout)
        record(SECTION, body, figures=README)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
