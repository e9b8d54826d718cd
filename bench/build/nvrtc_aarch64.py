"""Do NVIDIA's aarch64 NVRTC wheels compile our kernels to the same bytes as the x86_64 ones?

The release workflow builds aarch64 wheels natively on Arm runners, where NVRTC's aarch64 wheel
(pinned in buildtool/core/cuda_facts.py) compiles the kernels; a laptop's cross build reuses the x86_64
cubins. This script runs the pinned aarch64 libnvrtc under Debian's qemu-user (a small aarch64 C driver
that calls the NVRTC API) on real kernel units with the exact sources, headers and options `fa build`
uses, and compares each cubin with the x86_64 NVRTC's.

    python bench/build/nvrtc_aarch64.py --cuda 12 --arch 8.0 --units fwd_fp16_d128 bwd_bf16_d64

Needs g++-aarch64-linux-gnu (its gcc) and qemu-user from Debian, and PyPI for the NVRTC wheel (checked
against the pinned sha256). Prints one line per unit and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from unittest import mock

from buildtool.builder import toolkits
from buildtool.builder.compile import KernelTree, resolve
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.builder.plan import CompileJob
from buildtool.core import cpus, cuda_facts, fetch

DRIVER = r"""
/* drv LIBNVRTC ARCH OUT SRC NAME [--hdr NAME FILE]... -- OPTIONS... : one NVRTC program to a cubin */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int (*create_t)(void**, const char*, const char*, int, const char* const*, const char* const*);
typedef int (*compile_t)(void*, int, const char* const*);
typedef int (*size_fn)(void*, size_t*);
typedef int (*get_fn)(void*, char*);
static char* slurp(const char* p) {
  FILE* f = fopen(p, "rb"); if (!f) { perror(p); exit(2); }
  fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  char* b = malloc(n + 1); if (fread(b, 1, n, f) != (size_t)n) exit(2); b[n] = 0; fclose(f); return b;
}
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW); if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
  create_t create = (create_t)dlsym(h, "nvrtcCreateProgram");
  compile_t comp = (compile_t)dlsym(h, "nvrtcCompileProgram");
  size_fn cubin_size = (size_fn)dlsym(h, "nvrtcGetCUBINSize"), log_size = (size_fn)dlsym(h, "nvrtcGetProgramLogSize");
  get_fn cubin = (get_fn)dlsym(h, "nvrtcGetCUBIN"), get_log = (get_fn)dlsym(h, "nvrtcGetProgramLog");
  const char* names[64]; const char* srcs[64]; const char* opts[128]; int nh = 0, no = 0, i = 6;
  char arch[64]; snprintf(arch, sizeof arch, "--gpu-architecture=%s", argv[2]); opts[no++] = arch;
  for (; i < argc && strcmp(argv[i], "--"); i += 3) { names[nh] = argv[i + 1]; srcs[nh++] = slurp(argv[i + 2]); }
  for (i++; i < argc; i++) opts[no++] = argv[i];
  void* prog; if (create(&prog, slurp(argv[4]), argv[5], nh, srcs, names)) return 1;
  int rc = comp(prog, no, opts);
  size_t n; log_size(prog, &n); char* log = malloc(n + 1); get_log(prog, log);
  if (rc) { printf("compile failed (%d)\n%s\n", rc, log); return 1; }
  cubin_size(prog, &n); char* img = malloc(n); cubin(prog, img);
  FILE* o = fopen(argv[3], "wb"); fwrite(img, 1, n, o); fclose(o); return 0;
}
"""


def aarch64_nvrtc(major: int, dest: Path) -> Path:
    """The pinned aarch64 NVRTC wheel of `major`, hash-checked and unpacked; its lib directory."""
    tk = cuda_facts.TOOLKITS[major]
    pin = tk.wheels[cpus.AARCH64]
    with mock.patch.object(cpus.platform, "machine", return_value=cpus.AARCH64):
        url = toolkits.wheel_url(tk)
    wheel = fetch.download(url, dest / pin.file, pin.sha256, None)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest / "nvrtc", [m for m in zf.namelist() if m.startswith(tk.lib_subdir + "/")])
    return dest / "nvrtc" / tk.lib_subdir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", type=int, default=12)
    ap.add_argument("--arch", default="8.0")
    ap.add_argument("--units", nargs="+", default=["fwd_fp16_d128", "bwd_bf16_d128"])
    args = ap.parse_args()
    target = cpus.TARGETS[cpus.AARCH64]
    tree = KernelTree()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "drv.c").write_text(DRIVER)
        subprocess.run(
            [f"{target.triple}-gcc", "-O2", str(d / "drv.c"), "-o", str(d / "drv"), "-ldl"], check=True
        )
        arm_lib = aarch64_nvrtc(args.cuda, d)
        x86 = open_nvrtc(str(toolkits.nvrtc_lib_dir(args.cuda)))
        lib_name = next(p.name for p in arm_lib.glob("libnvrtc.so.*") if "builtins" not in p.name)
        for name in args.units:
            task = resolve(CompileJob(args.cuda, args.arch, "sass", name), tree)
            (d / "src.cu").write_text(task.source)
            hdr_args = []
            for i, (hname, text) in enumerate(task.headers):
                (d / f"h{i}").write_text(text)
                hdr_args += ["--hdr", hname, str(d / f"h{i}")]
            t0 = time.perf_counter()
            ref = x86.compile(
                task.source, task.source_name, task.target, list(task.options), dict(task.headers)
            )
            x86_s = time.perf_counter() - t0
            cmd = [
                target.qemu,
                "-L",
                f"/usr/{target.triple}",
                str(d / "drv"),
                str(arm_lib / lib_name),
                task.target,
                str(d / "arm.cubin"),
                str(d / "src.cu"),
                task.source_name,
                *hdr_args,
                "--",
                *task.options,
            ]
            t0 = time.perf_counter()
            run = subprocess.run(
                cmd, capture_output=True, text=True, env={"LD_LIBRARY_PATH": str(arm_lib)}, check=False
            )
            qemu_s = time.perf_counter() - t0
            same = run.returncode == 0 and (d / "arm.cubin").read_bytes() == ref.image
            results.append(
                {
                    "unit": name,
                    "target": task.target,
                    "bytes": len(ref.image),
                    "identical": same,
                    "x86_64_s": round(x86_s, 2),
                    "aarch64_under_qemu_s": round(qemu_s, 2),
                }
            )
            print(
                f"{name} {task.target}: {len(ref.image)} B, {'identical' if same else 'DIFFERENT'} "
                f"(x86_64 {x86_s:.1f} s, aarch64 under qemu {qemu_s:.1f} s){run.stdout.strip()}"
            )
    print(
        json.dumps({"cuda": args.cuda, "nvrtc": cuda_facts.TOOLKITS[args.cuda].version, "results": results})
    )
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
