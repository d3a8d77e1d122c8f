"""The rendered report in a real headless browser (Debian's Chromium through ChromeDriver; `.ci/run` installs them
when missing): the page loads, every image decodes, nothing is logged to the console; a screenshot is written
next to the report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kvplan.cli import main

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="Chromium and ChromeDriver are not installed (.ci/run installs them)")


def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1300,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


@pytest.mark.slow
def test_report_loads_with_every_image_and_no_console_error(tmp_path, capsys):
    doc = {"name": "browser", "model": "llama-3-8b", "hardware": "a100-40gb",
           "workload": {"trace": "sample:chat"}, "engine": {"block_size": 16, "gpu_memory_utilization": 0.9},
           "probe": {"duration_s": 120, "min_requests": 100},
           "sweep": {"grid": {"engine.eviction_policy": ["lru", "s3fifo"], "workload.rate": [2, 6]}},
           "slo": {"p99_ttft_ms": 2000, "attainment": {"tpot_ms": 100, "fraction": 0.9}}}
    path = tmp_path / "browser.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    report = out / "report.html"
    driver = browser()
    try:
        driver.get(report.as_uri())
        assert driver.title == "kvplan: browser"
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth]);")
        assert len(images) == len(list((out / "plots").glob("*.png"))) >= 4
        assert all(complete and width > 0 for _, complete, width in images), images
        assert driver.find_element("css selector", "p.rec").text.startswith("Recommended:")
        logs = driver.get_log("browser")
        assert not logs, logs
        driver.save_screenshot(str(out / "report.png"))
    finally:
        driver.quit()
    assert (out / "report.png").stat().st_size > 10_000
