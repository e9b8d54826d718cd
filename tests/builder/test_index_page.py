"""index.html in a real headless browser (Debian's chromium through its chromedriver, driven by selenium):
for machines of the test corpus (tests/select/envs), the line the page shows names the wheel
`fa doctor --env` picks, a no-fit answer shows doctor's reasons, for fp16 and for bf16; the page loads
with no console error, makes no network request, reads at 1280x900 and on a 390x844 phone (no command
broken inside a word, every column of the table shown), opens on a machine that is not a red answer,
labels every control and sorts its table.

Skipped only when chromium, its driver or selenium is missing (.ci/run installs chromium with apt)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from buildtool.builder import index_page
from buildtool.compat import picker
from buildtool.compat.env import env_from_json
from buildtool.core.runtime import schema, versions
from tests.builder.conftest import fa_command, pip_download
from tests.select.fixture_index import all_wheel_index, fixture_index

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "tests" / "select" / "envs"
# Debian's chromium and its driver (.ci/run installs them with apt), else the ones on PATH.
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium")) if p and Path(p).exists()), None)
CHROMEDRIVER = next(
    (p for p in ("/usr/bin/chromedriver", shutil.which("chromedriver")) if p and Path(p).exists()), None
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Machines of the corpus a person finds on the page: an OS and CPU the wheels are built for, a torch the
# index serves, a GPU family the picker offers. The rest are answered by `fa doctor` only (macOS,
# sm 13.0, torch 2.16, ...).
CASES = (
    "a100-ngc-24.10",
    "aws-a10g-pypi-torch",
    "b200-sm100",
    "cpu-only-torch",
    "driver470-cu12-wheels-only",
    "centos7-glibc217",  # glibc 2.17: no manylinux_2_28 wheel installs, the universal wheel does
    "driver520-torch-cu118",
    "gb10-dgx-spark",
    "gh200-ngc-aarch64",
    "h100-driver470-torch27-cu128",
    "jetson-orin-aarch64",
    "local-torch212-old-abi",
    "ngc-torch212-stable-abi",
    "p100-torch113",  # torch 1.13: nothing fits
    "python313t-free-threaded",
    "rtx4090-windows",  # torch 2.5 on Windows: the universal wheel (Windows wheels start at 2.10)
    "rtx4090-windows-torch212",
    "rtx5090-sm120",
    "t4-colab-bf16",
    "v100-sm70",
)

DESKTOP = (1280, 900)
PHONE = (390, 844)

needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium or chromedriver is missing (apt-get install chromium chromium-driver; .ci/run does)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A folder with the fixture index.json (every per-variant wheel of matrix.yaml, the all-wheels and
    the universal wheel) and the page written for it."""
    data = fixture_index()
    data["all_wheels"] = all_wheel_index()["all_wheels"]
    folder = tmp_path_factory.mktemp("site")
    (folder / "index.json").write_text(json.dumps(data))
    page = index_page.write_page(folder, schema.read_index(data))
    return folder, _embedded(page.read_text())


def _embedded(page: str) -> dict[str, Any]:
    """The answers a page carries."""
    return json.loads(page.split('<script type="application/json" id="fa-data">')[1].split("</script>")[0])


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    from selenium import webdriver  # the test extra installs it: missing is a failure, not a skip
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    assert CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(*DESKTOP)
    yield driver
    driver.quit()


# `fa doctor --env FILE --wheels DIR --json` for each file, run by the console script's own entry point
# in one process (a process per machine would cost a Python start each).
DOCTOR = """
import contextlib, io, json, sys
from buildtool import cli
out, wheels = {}, sys.argv[1]
for env_file in sys.argv[2:]:
    sys.argv = ["fa", "doctor", "--env", env_file, "--wheels", wheels, "--json"]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            cli.main()
        except SystemExit as done:
            assert done.code in (0, 1), (env_file, done.code)
    out[env_file] = json.loads(text.getvalue())
print(json.dumps(out))
"""


def _doctor(env_files: list[Path], wheels: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", DOCTOR, str(wheels), *map(str, env_files)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return {Path(k).stem: v for k, v in json.loads(done.stdout).items()}


def _pick(browser, key: tuple[str, ...], python: str, dtype: str = "bf16") -> None:
    from selenium.webdriver.support.ui import Select

    for axis, value in zip(picker.AXES, key, strict=True):
        element = browser.find_element("id", f"pick-{axis}")
        if element.is_displayed():
            Select(element).select_by_value(python if axis == "python" else value)
        else:  # a one-option axis (the ABI where wheels do not differ in it, the driver without a GPU)
            assert element.get_attribute("value") == value
    Select(browser.find_element("id", "pick-dtype")).select_by_value(dtype)


def _shown(browser) -> dict[str, Any]:
    script = """
    const $ = (id) => document.getElementById(id);
    return {verdict: $("verdict").dataset.verdict, install: !$("install").hidden,
            file: $("wheel-file").textContent, pip: $("line-pip").textContent, uv: $("line-uv").textContent,
            runtime: $("runtime").textContent, size: $("wheel-size").textContent,
            codes: Array.from(document.querySelectorAll("#because .code-name")).map((e) => e.textContent),
            because: $("because").innerText};
    """
    return browser.execute_script(script)


@needs_browser
def test_the_page_names_the_wheel_doctor_picks(site, browser):
    folder, data = site
    browser.get((folder / index_page.PAGE).as_uri())
    reports = _doctor([ENVS / f"{name}.json" for name in CASES], folder)
    no_fit = 0
    for name, dtype in [(c, d) for c in CASES for d in ("fp16", "bf16")]:
        env_file = ENVS / f"{name}.json"
        env = env_from_json(json.loads(env_file.read_text())["env"])
        _pick(browser, picker.option_key(env, data), env.python, dtype)
        shown = _shown(browser)
        report = reports[name]
        (answer,) = [a for a in report["dtypes"] if a["dtype"] == dtype]
        assert shown["verdict"] == answer["verdict"], (name, dtype)
        assert shown["codes"] == answer["codes"], (name, dtype)
        if report["selected"] is None:
            no_fit += 1
            assert not shown["install"], name
            for reason in answer["because"]:  # worded as doctor words them (the numbers are the page's)
                assert reason["fix"].split(" ")[0] in shown["because"], name
            continue
        assert shown["file"] == report["selected"], name
        assert report["selected"].split("-")[1].split("+")[0] in shown["pip"], name
        assert shown["pip"].startswith("pip install --index-url " + folder.as_uri() + "/"), name
        assert shown["uv"].startswith("uv pip install --index-url " + folder.as_uri() + "/"), name
    assert no_fit >= 1


@needs_browser
def test_no_console_error_and_no_network_request(site, browser):
    folder, _data = site
    browser.get("about:blank")  # so the page is loaded again, not scrolled to a fragment
    browser.get_log("performance")  # drop what earlier tests did
    browser.get_log("browser")
    browser.get(
        (folder / index_page.PAGE).as_uri() + "#linux-x86_64/2.28/2.13/13/auto/3.12/9.0/580.65.06/bf16"
    )
    browser.find_element("id", "pick-gpu").send_keys("A")  # a change runs the page's script again
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
    requested = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.append(message["params"]["request"]["url"])
    assert requested, "the performance log saw no request at all (not even the page itself)"
    assert [u for u in requested if not u.startswith(("file://", "data:"))] == []


@needs_browser
@pytest.mark.parametrize(("width", "height"), [(390, 844), (1280, 900)])
def test_readable_at_width(site, browser, width, height):
    folder, _data = site
    browser.set_window_size(width, height)
    browser.get((folder / index_page.PAGE).as_uri())
    # Nothing but the table's own scrolling region is wider than the window.
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0
    browser.set_window_size(*DESKTOP)


@needs_browser
def test_every_control_has_a_label_and_the_focus_order_follows_the_form(site, browser):
    folder, data = site
    browser.get((folder / index_page.PAGE).as_uri())
    for axis in data["axes"]:
        labels = browser.find_elements("css selector", f'label[for="pick-{axis}"]')
        texts = [label.get_attribute("textContent").strip() for label in labels]
        assert len(texts) == 1, axis
        assert texts[0], axis
    order = browser.execute_script(
        "return Array.from(document.querySelectorAll('select, button, a[href], [tabindex=\"0\"]'))"
        ".filter((e) => e.offsetParent !== null).map((e) => e.id || e.tagName)"
    )
    visible = [f"pick-{a}" for a in data["axes"] if f"pick-{a}" in order]
    assert order[: len(visible)] == visible


@needs_browser
def test_the_table_lists_every_wheel_and_sorts_by_a_heading(site, browser):
    folder, _data = site
    browser.get((folder / index_page.PAGE).as_uri())
    files = browser.execute_script(
        "return Array.from(document.querySelectorAll('#wheels tbody tr')).map((r) => r.dataset.file)"
    )
    entries = schema.read_index(json.loads((folder / "index.json").read_text()))
    assert sorted(files) == sorted(e.file for e in entries)
    header = browser.find_element("css selector", 'button[data-key="variant"]')
    header.click()
    variants = browser.execute_script(
        "return Array.from(document.querySelectorAll('#wheels tbody tr')).map((r) => r.dataset.variant)"
    )
    assert variants[0] == "all"
    assert variants[-1] == "universal"
    header.click()
    th = browser.find_element("css selector", 'th:has(button[data-key="variant"])')
    assert th.get_attribute("aria-sort") == "descending"


def _fa_index(folder: Path) -> subprocess.CompletedProcess[str]:
    """`fa index FOLDER`, run as a user runs it."""
    return subprocess.run(
        fa_command("index", str(folder)), check=False, capture_output=True, text=True, cwd=REPO
    )


def test_fa_index_writes_the_page(tmp_path):
    """`fa index` on a folder of real wheels writes index.html, whose embedded answers name the wheel
    doctor picks, with the wheel's real sha256."""
    from tests.select.fixture_index import kernel_entry, universal_entry
    from tests.select.tiny_wheels import build_wheel

    kernel = build_wheel(tmp_path, kernel_entry(12, "2.5", False))
    build_wheel(tmp_path, universal_entry())
    done = _fa_index(tmp_path)
    assert done.returncode == 0, done.stderr
    data = _embedded((tmp_path / index_page.PAGE).read_text())
    env = env_from_json(json.loads((ENVS / "aws-a10g-pypi-torch.json").read_text())["env"])
    node = data["tree"]
    for part in picker.option_key(env, data):
        node = node[part]
    wheel = data["wheels"][data["answers"][node[data["dtypes"].index("bf16")]]["wheel"]]
    assert wheel["file"] == kernel.name
    assert wheel["sha256"] == schema.read_index(json.loads((tmp_path / "index.json").read_text()))[0].sha256
    # The page's pip line, with this folder for the base as the page's script puts it, fetches that wheel.
    line = wheel["pip"].replace(data["base_url"], tmp_path.as_uri())
    args = line.split()
    assert args[:2] == ["pip", "install"]
    assert pip_download(tmp_path / "fetched", *args[2:]) == [kernel.name]


def test_an_index_with_the_universal_wheel_alone_still_answers(tmp_path):
    """No kernel wheel: every machine gets the universal wheel (calls fall back), torch below fa's
    floor gets nothing, with doctor's reasons."""
    from tests.select.fixture_index import universal_entry

    entries = schema.read_index({"schema": 1, "wheels": [universal_entry()]})
    data = _embedded(index_page.write_page(tmp_path, entries).read_text())
    verdicts = {data["answers"][i]["verdict"] for i in _leaves(data["tree"])}
    assert verdicts == {"fallback", "no-wheel"}


def _leaves(node: Any) -> list[int]:
    if isinstance(node, list):  # an answer per dtype
        return node
    return [leaf for child in node.values() for leaf in _leaves(child)]


def test_fa_index_leaves_an_index_html_it_did_not_write(tmp_path):
    from tests.select.fixture_index import universal_entry
    from tests.select.tiny_wheels import build_wheel

    build_wheel(tmp_path, universal_entry())
    own = tmp_path / index_page.PAGE
    own.write_text("<!DOCTYPE html><title>our landing page</title>\n")
    done = _fa_index(tmp_path)
    assert done.returncode == 0, done.stderr
    assert own.read_text() == "<!DOCTYPE html><title>our landing page</title>\n"
    assert "is not fa's page: left as it is" in " ".join(done.stdout.split())  # wrapped at 80 columns
    own.unlink()
    assert index_page.write_page(
        tmp_path, schema.read_index(json.loads((tmp_path / "index.json").read_text()))
    )
    assert index_page.is_ours(own)  # and fa rewrites its own page next time


@needs_browser
def test_each_os_labels_its_own_driver_ranges(site, browser):
    """Windows numbers its drivers and floors its own way: its ranges are not Linux's."""
    folder, data = site
    for platform in data["options"]["platform"]:
        browser.get("about:blank")
        glibc = "2.28" if platform["id"].startswith("linux") else "none"
        browser.get((folder / index_page.PAGE).as_uri() + f"#{platform['id']}/{glibc}/2.12/12/auto/3.12/8.9/")
        shown = browser.execute_script(
            "return Array.from(document.getElementById('pick-driver').options).map((o) => o.text)"
        )
        assert shown == list(data["driver_labels"][platform["id"]].values()), platform["id"]


def _machine(case: str, **change: Any):
    """A corpus machine, some fields changed (env_from_json's shape)."""
    return env_from_json({**json.loads((ENVS / f"{case}.json").read_text())["env"], **change})


def _open(browser, folder: Path, fragment: str = "") -> None:
    browser.get("about:blank")  # so a fragment alone is a new load
    browser.get((folder / index_page.PAGE).as_uri() + fragment)


@needs_browser
def test_the_page_opens_on_the_most_common_machine_and_never_on_a_red_answer(site, browser):
    """It once opened on driver "older than 450.80.02" with CUDA 13: a red answer nobody has."""
    folder, _data = site
    _open(browser, folder)
    shown = _shown(browser)
    assert shown["verdict"] in ("ok", "ok-jit"), shown
    assert browser.find_element("id", "preset").is_displayed()
    assert "H100" in browser.execute_script(
        "return document.getElementById('pick-gpu').selectedOptions[0].text"
    )
    # Drivers newest first, the range below them all last, each labelled as nvidia-smi prints one.
    options = browser.execute_script(
        "return Array.from(document.getElementById('pick-driver').options).map((o) => [o.value, o.text])"
    )
    assert browser.find_element("id", "pick-driver").get_attribute("value") == options[0][0]
    floors = [value for value, _label in options[:-1]]
    assert floors == sorted(floors, key=versions.parse_driver, reverse=True)
    assert options[0][1].endswith(" or newer")
    assert options[-1][1].startswith("older than ")
    assert not [label for _v, label in options if "(below" in label]
    assert "575.51.03 to 579.x" in [label for _v, label in options]
    # A choice made hides the note: the answer is then the reader's.
    browser.find_element("id", "pick-dtype").send_keys("f")
    assert not browser.find_element("id", "preset").is_displayed()


@needs_browser
def test_the_chosen_gpu_family_is_shown_not_its_first_gpu(site, browser):
    """Picking RTX 40xx once showed "GPU 0 (L4, sm 8.9)"."""
    folder, data = site
    env = _machine("aws-a10g-pypi-torch", gpus=[{"name": "NVIDIA GeForce RTX 4090", "sm": "8.9"}])
    _open(browser, folder)
    _pick(browser, picker.option_key(env, data), env.python)
    runtime = _shown(browser)["runtime"]
    assert "RTX 40xx" in runtime
    assert "(L4, sm 8.9)" not in runtime
    assert "bf16, SASS for sm 8." in runtime


@needs_browser
def test_a_t4_runs_fp16_and_only_bf16_falls_back(site, browser):
    folder, data = site
    env = _machine("t4-colab-bf16")
    _open(browser, folder)
    _pick(browser, picker.option_key(env, data), env.python, "fp16")
    assert _shown(browser)["verdict"] == "ok"
    _pick(browser, picker.option_key(env, data), env.python, "bf16")
    shown = _shown(browser)
    assert (shown["verdict"], shown["codes"]) == ("fallback", ["dtype-unsupported"])


@needs_browser
def test_no_wheel_is_recommended_that_the_chosen_glibc_cannot_install(site, browser):
    """A glibc 2.27 T4 (older than the wheels' manylinux_2_28) once got a manylinux_2_28 wheel."""
    import re

    folder, data = site
    labels = {o["id"]: o["label"] for o in data["options"]["glibc"]}
    for glibc in ("2.31", "2.27", "2.17"):
        env = _machine("t4-colab-bf16", glibc=glibc)
        key = picker.option_key(env, data)
        _open(browser, folder)
        _pick(browser, key, env.python, "fp16")
        shown = _shown(browser)
        needs = re.search(r"manylinux_(\d+)_(\d+)_", shown["file"]) if shown["install"] else None
        if needs:
            assert (int(needs[1]), int(needs[2])) <= tuple(map(int, glibc.split("."))), (glibc, shown["file"])
        if glibc == "2.31":
            assert labels[key[1]] == "2.28 or newer"
            assert shown["verdict"] == "ok"
        else:
            assert labels[key[1]] == "older than 2.28"
            assert shown["file"].endswith("-py3-none-any.whl")
            assert "glibc-too-old" in shown["codes"]


@needs_browser
def test_a_phone_never_breaks_a_command_inside_a_word_and_shows_every_column(site, browser):
    """At 390x844 pip lines once broke as `fa-⏎attn==0.1.0` and the table showed 3 of its 9 columns."""
    folder, _data = site
    browser.set_window_size(*PHONE)
    try:
        _open(browser, folder)
        broken = browser.execute_script(
            r"""
            const broken = [];
            for (const el of document.querySelectorAll("pre, .hint code")) {
              const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
              for (let node = walk.nextNode(); node; node = walk.nextNode()) {
                const text = node.textContent;
                for (const match of text.matchAll(/\S+/g)) {
                  const range = document.createRange();
                  range.setStart(node, match.index);
                  range.setEnd(node, match.index + match[0].length);
                  const tops = new Set(Array.from(range.getClientRects()).map((r) => Math.round(r.top)));
                  if (tops.size > 1) broken.push(el.id + ": " + match[0]);
                }
              }
            }
            return broken;
            """
        )
        assert broken == []
        cells = browser.execute_script(
            """
            const row = document.querySelector("#wheels tbody tr");
            return Array.from(row.cells).map((c) => {
              const r = c.getBoundingClientRect();
              return [c.dataset.label, r.left >= 0 && r.right <= window.innerWidth && r.width > 0];
            });
            """
        )
        assert len(cells) == 8
        assert all(inside for _label, inside in cells), cells
    finally:
        browser.set_window_size(*DESKTOP)


def test_sizes_are_in_mib_as_the_cli_prints_them():
    from tests.select.fixture_index import universal_entry

    entry = {**universal_entry(), "size": 9_680_000}
    entries = schema.read_index({"schema": 1, "package": "fa-attn", "wheels": [entry]})
    assert index_page.wheel_rows(entries)[0]["size_text"] == "9.2 MiB"
    page = index_page.render(entries)
    assert "9.2 MiB" in page
    assert " MB" not in page


def test_every_torch_minor_the_wheels_serve_is_offered_and_one_without_a_wheel_says_what_to_do(tmp_path):
    """Per-minor wheels for 2.5 and 2.7 and a stable-ABI wheel tested with 2.10, 2.11 and 2.13: 2.12 is
    served (the stable ABI), 2.6, 2.8 and 2.9 are not, and each is on the page with its answer."""
    from tests.select.fixture_index import kernel_entry, universal_entry

    wheels = [
        kernel_entry(12, "2.5", False),
        kernel_entry(12, "2.7", True),
        kernel_entry(12, "2.10", None, tested=("2.10", "2.11", "2.13")),
        universal_entry(),
    ]
    entries = schema.read_index({"schema": 1, "package": "fa-attn", "wheels": wheels})
    data = _embedded(index_page.write_page(tmp_path, entries).read_text())
    minors = [o["id"] for o in data["options"]["torch"]]
    assert {"2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13"} <= set(minors)

    def shown(minor: str, cxx11abi: bool) -> dict:
        torch = {"version": f"{minor}.0+cu124", "cuda": "12.4", "hip": None, "cxx11abi": cxx11abi}
        env = _machine("aws-a10g-pypi-torch", torch=torch, driver={"version": "580.65.06"})
        node = data["tree"]
        for part in picker.option_key(env, data):
            node = node[part]
        return data["answers"][node[data["dtypes"].index("bf16")]]

    stable = shown("2.12", True)
    assert stable["verdict"] == "ok"
    assert "2.10plus" in data["wheels"][stable["wheel"]]["file"]
    missing = shown("2.6", False)
    assert missing["verdict"] in ("fallback", "no-wheel")
    fixes = [data["reasons"][i]["fix"] for i in missing["because"]]
    assert any("no wheel here serves torch 2.6" in f and "fa install --build" in f for f in fixes), fixes
    assert not any("`fa install` picks it" in f for f in fixes), fixes
