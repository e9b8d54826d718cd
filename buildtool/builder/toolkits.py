"""The CUDA toolkits of a build: NVRTC from NVIDIA's PyPI wheels, pinned by version and sha256.

Our kernels include no CUDA header (docs/contracts.md section 1), so NVRTC's own wheel is the whole
toolkit: no system CUDA, no nvcc. Each pinned wheel (buildtool/core/cuda_facts.py) is fetched once into
the cache, refused unless its sha256 matches the pin, and its lib directory unpacked once under a
lock, so two builds sharing FA_CACHE wait for each other instead of unpacking over each other.

FA_TOOLKIT_WHEELS may name a directory holding the pinned wheel files (air-gapped builds, CI
mirrors); they are checked against the same pins. FA_PYPI_SIMPLE overrides the index
(https://pypi.org/simple).
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin

from buildtool.core import atomic, cache, cpus, fetch
from buildtool.core.cuda_facts import TOOLKITS, PinnedWheel, Toolkit
from buildtool.errors import FaError


class ToolkitError(FaError):
    """A toolkit that could not be fetched or did not match its pin."""


def toolkit(major: int) -> Toolkit:
    try:
        return TOOLKITS[major]
    except KeyError:
        known = ", ".join(str(m) for m in sorted(TOOLKITS))
        raise ToolkitError(f"no pinned NVRTC for CUDA {major} (known: {known})") from None


def pinned_wheel(tk: Toolkit) -> PinnedWheel:
    """The pinned NVRTC wheel for this machine's CPU (NVRTC runs here, whatever the wheels' platform)."""
    host = cpus.host()
    pin = tk.wheel_for(host)
    if pin is None:
        raise ToolkitError(
            f"NVIDIA publishes no {tk.package}=={tk.version} wheel for {host} machines "
            f"(pinned for {', '.join(tk.wheels)}); build on one of those"
        )
    return pin


def toolkits_root() -> Path:
    return cache.cache_dir() / "toolkits"


def _unpacked_dir(tk: Toolkit) -> Path:
    return toolkits_root() / f"{tk.package}-{tk.version}"


def is_unpacked(major: int) -> bool:
    tk = toolkit(major)
    return (_unpacked_dir(tk) / tk.lib_subdir).is_dir()


def wheel_url(tk: Toolkit) -> str:
    """The pinned file's URL, read from the PEP 503 page of its project."""
    return listed_url(tk.package, pinned_wheel(tk).file)


def listed_url(package: str, file: str) -> str:
    """The URL of `file` as the PEP 503 page of `package` lists it."""
    page_url = f"{fetch.simple_index()}/{package}/"
    page = fetch.read_url(page_url).decode(errors="replace")
    for href in re.findall(r'href="([^"]+)"', page):
        url = href.split("#", 1)[0]
        if url.rsplit("/", 1)[-1] == file:
            return str(url) if "://" in url else urljoin(page_url, url)
    raise ToolkitError(f"{file} is not listed on {page_url} (was the pinned version yanked?)")


def fetch_wheel(major: int, progress: fetch.ProgressHook | None = None) -> Path:
    """The pinned wheel, hash-checked, in the cache's download area."""
    tk = toolkit(major)
    return fetch_pinned(
        tk.package, pinned_wheel(tk), f"CUDA {major} toolkit ({tk.package}=={tk.version})", progress
    )


def fetch_pinned(
    package: str, pin: PinnedWheel, what: str, progress: fetch.ProgressHook | None = None
) -> Path:
    """The pinned file of `package`, hash-checked, in the cache's download area: from FA_TOOLKIT_WHEELS
    when that folder holds it, else from the index. `what` names it in errors."""
    dest = toolkits_root() / "downloads" / pin.file
    if dest.is_file() and fetch.sha256_file(dest) == pin.sha256:
        return dest
    local = os.environ.get("FA_TOOLKIT_WHEELS")
    try:
        if local and (Path(local) / pin.file).is_file():
            fetch.download((Path(local) / pin.file).resolve().as_uri(), dest, pin.sha256, progress)
        else:
            fetch.download(listed_url(package, pin.file), dest, pin.sha256, progress)
    except fetch.FetchError as e:
        raise ToolkitError(f"{what}: {e}") from e
    return dest


def nvrtc_lib_dir(major: int, progress: fetch.ProgressHook | None = None) -> Path:
    """The directory holding libnvrtc.so.* for CUDA `major`, fetching and unpacking it on first use."""
    tk = toolkit(major)
    final = _unpacked_dir(tk)
    lib = final / tk.lib_subdir
    if not lib.is_dir():
        unpack(final, lambda: fetch_wheel(major, progress), tk.lib_subdir + "/", is_dir=True)
    return lib


def unpack(
    final: Path, wheel: Callable[[], Path], prefix: str, is_dir: bool, executable: bool = False
) -> None:
    """Unpack the members of a wheel under `prefix` (one file when not `is_dir`) into the folder
    `final`, under a lock and all at once; `wheel()` fetches the wheel, only if `final` is not there
    yet. The wheel file is deleted after: the unpacked part is what we keep."""
    with cache.locked(final):
        if final.is_dir():  # another build unpacked it while we waited
            return
        path = wheel()
        _sweep_partial(final.parent, final.name)
        tmp = atomic.make_temp_dir(final)
        try:
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.namelist() if (m.startswith(prefix) if is_dir else m == prefix)]
                if not members:
                    raise ToolkitError(f"{path.name} holds nothing {'under' if is_dir else 'named'} {prefix}")
                for m in members:
                    out = zf.extract(m, tmp)  # zipfile checks each member's CRC-32 as it reads
                    if executable:
                        os.chmod(out, 0o755)
            os.replace(tmp, final)  # the whole tree appears at once
        except (zipfile.BadZipFile, OSError) as e:
            raise ToolkitError(f"cannot unpack {path}: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        path.unlink(missing_ok=True)


def _sweep_partial(parent: Path, name: str) -> None:
    """Remove half-unpacked trees left by a killed build (only ever called under the lock)."""
    for p in parent.glob(name + atomic.TMP_MARK + "*"):
        shutil.rmtree(p, ignore_errors=True)
