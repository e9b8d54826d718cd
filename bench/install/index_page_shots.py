"""The index page's screenshots in docs/ (docs/using.md): the page of the test fixture's index
(tests/select/fixture_index.py: every wheel of matrix.yaml, placeholder sizes and hashes) in headless
Chromium, at 1280x900 and on a 390x844 phone, answering a T4 with torch 2.5 (CUDA 12, old C++ ABI),
driver 525.60.13 and bf16 calls.

    python bench/install/index_page_shots.py --out docs

Writes index-page.png (1280x900, from the picker down) and index-page-phone.png (390x844, from the answer down) into --out
(default: $FA_CACHE or ~/.cache/fa, under index-page-shots/); needs chromium, chromedriver and selenium.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "kernels")]

from buildtool.builder import index_page
from buildtool.core.runtime import schema
from tests.select.fixture_index import all_wheel_index, fixture_index

# The T4 of docs/using.md's caption, as the page's address keeps a choice (picker.AXES, then the dtype).
T4 = "#linux-x86_64/2.28/2.5/12/false/3.12/7.5/525.60.13/bf16"
SIZES = {"index-page.png": ((1280, 900), "pick-title"), "index-page-phone.png": ((390, 844), "answer")}


def main() -> int:
    cache = Path(os.environ.get("FA_CACHE") or Path.home() / ".cache" / "fa")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=cache / "index-page-shots")
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    data = fixture_index()
    data["all_wheels"] = all_wheel_index()["all_wheels"]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "index.json").write_text(json.dumps(data))
        page = index_page.write_page(Path(folder), schema.read_index(data))
        assert page is not None
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            for name, ((width, height), scroll_to) in SIZES.items():
                browser.set_window_size(width, height)
                browser.get("about:blank")
                browser.get(page.as_uri() + T4)
                if scroll_to:
                    browser.execute_script(f"document.getElementById('{scroll_to}').scrollIntoView()")
                browser.save_screenshot(str(args.out / name))
                print(args.out / name)
        finally:
            browser.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
