"""The web console in a real browser (issue 33): headless Chromium, driven by Selenium through
Debian's chromedriver, opens every page of a one-node cluster that holds a topic with records
and a consumer group with committed offsets, checks what each page shows against the admin
API (the lag shown is what ``raftlog group describe`` computes, dataplane.client.group_lag),
produces a record through the form and finds it on the records page, waits for the charts
(throughput, ISR size, lag) to draw lines, and opens the Connect and chaos pages of a console
run on its own in this process (a fake Connect worker, reports chaos/report.py wrote). Each
page's screenshot
is saved in the test's directory, and also in $CONSOLE_SCREENSHOTS_DIR when set (the docs'
docs/assets/console/)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane.client import AdminClient, Consumer, Producer, TopicPartition
from dataplane.client.group_lag import describe_group_lag
from dataplane.console.server import Console, ConsoleServer
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.console.test_console_outside import _report, fake_connect_worker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(
        "Debian's chromium and chromium-driver are not installed (make test installs them)",
        allow_module_level=True,
    )
from selenium.webdriver.common.by import By  # noqa: E402 (after the skip: selenium may be absent)

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("console")]

TOPIC = "orders"
GROUP = "billing"
PAGE_LOAD_S = 20
# the charts' sampler every 0.5 s, so a few samples exist within seconds
ONE_NODE: dict[str, str | int] = {
    "offsets.topic.replication.factor": 1,
    "console.sample.interval.ms": 500,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("console"), "console", ONE_NODE, nodes=1
    ) as running:
        create_topic(running, TOPIC, 2, rf=1)
        with Producer(running.bootstrap_servers) as producer:
            for n in range(5):
                value = json.dumps({"order": n, "total": 10 * n}).encode()
                producer.send(
                    TOPIC, value, f"k{n}".encode(), partition=0, headers=[("src", b"web")]
                )
            for _ in range(3):
                producer.send(TOPIC, b"\x00\xffraw", None, partition=1)
            producer.flush()
        with Consumer(running.bootstrap_servers, group_id=GROUP) as consumer:
            consumer.commit({TopicPartition(TOPIC, 0): 2, TopicPartition(TOPIC, 1): 1})
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--disable-gpu"):  # fmt: skip
        options.add_argument(argument)
    # the system chromedriver, named: Selenium Manager downloads nothing
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(PAGE_LOAD_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("screenshots")
    yield directory
    wanted = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        for shot in sorted(directory.glob("*.png")):
            shutil.copy(shot, Path(wanted) / shot.name)


def _open(browser: Any, cluster: LocalCluster, path: str) -> None:
    address = cluster.console_address(1)
    assert address is not None, "a plaintext broker node serves the console"
    browser.get(f"http://{address}{path}")
    assert not browser.find_elements(By.ID, "error"), browser.find_element(By.ID, "error").text


def _cells(browser: Any, row_selector: str) -> list[str]:
    return [c.text for c in browser.find_element(By.CSS_SELECTOR, row_selector).find_elements(
        By.TAG_NAME, "td")]  # fmt: skip


def test_cluster_page(browser: Any, cluster: LocalCluster, screenshots: Path) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        described, quorum = admin.describe_cluster(), admin.describe_quorum()
        topics = admin.describe_topics()  # __consumer_offsets' partitions included
        disk = admin.describe_log_dirs()[1]
    led = sum(p.leader == 1 for t in topics.values() for p in t.partitions)
    assert disk.used_bytes > 0 and disk.replica_bytes[TopicPartition(TOPIC, 0)] > 0
    _open(browser, cluster, "/")
    assert browser.find_element(By.ID, "cluster-id").text == described.cluster_id
    assert browser.find_element(By.ID, "active-controller").text == str(quorum.leader_id)
    assert int(browser.find_element(By.ID, "metadata-offset").text) >= described.metadata_offset
    broker = _cells(browser, 'tr[data-broker="1"]')
    assert broker[0] == "1" and broker[1] == cluster.broker_address(1)
    assert broker[2] == "unfenced" and broker[4] == str(led)
    assert broker[6].endswith(("B", "KiB", "MiB")) and broker[7].endswith(("MiB", "GiB", "TiB"))
    assert _cells(browser, 'tr[data-voter="1"]')[2] == "active"
    browser.save_screenshot(str(screenshots / "cluster.png"))


def test_topics_and_topic_pages(browser: Any, cluster: LocalCluster, screenshots: Path) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        topic = admin.describe_topics([TOPIC])[TOPIC]
    _open(browser, cluster, "/topics")
    row = _cells(browser, f'tr[data-topic="{TOPIC}"]')
    assert row[:5] == [TOPIC, "2", "1", "0", "8"] and row[5].endswith(("B", "KiB"))
    browser.save_screenshot(str(screenshots / "topics.png"))
    browser.find_element(By.LINK_TEXT, TOPIC).click()
    for p in topic.partitions:
        cells = _cells(browser, f'tr[data-partition="{p.partition}"]')
        assert cells[1] == str(p.leader)
        assert cells[3] == ",".join(map(str, p.replicas)) and cells[4] == ",".join(map(str, p.isr))
    assert _cells(browser, 'tr[data-partition="0"]')[6:9] == ["0", "5", "5"]
    assert _cells(browser, 'tr[data-partition="0"]')[9].endswith(("B", "KiB"))
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-config="retention.ms"]')
    browser.save_screenshot(str(screenshots / "topic.png"))


def test_records_page_and_the_produce_form(
    browser: Any, cluster: LocalCluster, screenshots: Path
) -> None:
    _open(browser, cluster, f"/topics/{TOPIC}/records?partition=0&offset=0")
    rows = browser.find_elements(By.CSS_SELECTOR, "#records tbody tr")
    assert [r.get_attribute("data-offset") for r in rows] == ["0", "1", "2", "3", "4"]
    value = rows[3].find_element(By.CSS_SELECTOR, "td.value pre")
    assert value.get_attribute("data-format") == "json"
    assert json.loads(value.text) == {"order": 3, "total": 30}
    assert "src: web" in rows[3].text and "k3" in rows[3].text
    browser.save_screenshot(str(screenshots / "records.png"))

    form = browser.find_element(By.ID, "produce")
    form.find_element(By.CSS_SELECTOR, 'select[name="partition"] option[value="1"]').click()
    form.find_element(By.NAME, "key").send_keys("from-the-browser")
    form.find_element(By.NAME, "value").send_keys('{"made": "by selenium"}')
    form.find_element(By.NAME, "headers").send_keys("origin=console")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(
        "the produced record's page", lambda: browser.find_elements(By.ID, "produced") or None, 20
    )
    assert browser.find_element(By.ID, "produced").text == "Produced at offset 3."
    row = browser.find_element(By.CSS_SELECTOR, '#records tr[data-offset="3"]')
    assert "from-the-browser" in row.text and "origin: console" in row.text
    assert json.loads(row.find_element(By.CSS_SELECTOR, "td.value pre").text) == {
        "made": "by selenium"
    }
    with Consumer(cluster.bootstrap_servers) as consumer:  # the broker has it too
        assert consumer.end_offsets([TopicPartition(TOPIC, 1)])[TopicPartition(TOPIC, 1)] == 4
    browser.save_screenshot(str(screenshots / "produced.png"))


def test_group_pages_show_the_lag_group_describe_computes(
    browser: Any, cluster: LocalCluster, screenshots: Path
) -> None:
    _open(browser, cluster, "/groups")
    assert _cells(browser, f'tr[data-group="{GROUP}"]')[:1] == [GROUP]
    browser.save_screenshot(str(screenshots / "groups.png"))
    browser.find_element(By.LINK_TEXT, GROUP).click()
    with AdminClient(cluster.bootstrap_servers) as admin:
        expected = describe_group_lag(admin, cluster.bootstrap_servers, GROUP)
    assert expected.rows, "the group committed offsets"
    for row in expected.rows:
        cells = _cells(browser, f'tr[data-tp="{row.topic}-{row.partition}"]')
        assert cells[2:5] == [str(row.current_offset), str(row.log_end_offset), str(row.lag)]
    browser.save_screenshot(str(screenshots / "group.png"))


def _lines(browser: Any, chart_id: str) -> Any:
    return browser.find_elements(By.CSS_SELECTOR, f"svg#{chart_id} polyline")


def test_charts_draw_the_sampled_history(
    browser: Any, cluster: LocalCluster, screenshots: Path
) -> None:
    """The sampler (every 0.5 s here) has a few samples: records in and out, each partition's
    ISR size and the group's lag are drawn as lines."""
    with Producer(cluster.bootstrap_servers) as producer:  # something to draw a rate of
        for n in range(20):
            producer.send(TOPIC, f"more {n}".encode(), None, partition=n % 2)
        producer.flush()

    def charted(path: str, chart_id: str, lines: int) -> bool | None:
        _open(browser, cluster, path)
        return len(_lines(browser, chart_id)) >= lines or None

    wait_for("the topic's charts", lambda: charted(f"/topics/{TOPIC}", "chart-throughput", 2), 30)
    names = {line.get_attribute("data-series") for line in _lines(browser, "chart-isr")}
    assert names == {"p0", "p1"}
    browser.save_screenshot(str(screenshots / "topic-charts.png"))
    wait_for("the group's lag chart", lambda: charted(f"/groups/{GROUP}", "chart-lag", 1), 30)
    browser.save_screenshot(str(screenshots / "group.png"))


def test_connect_and_chaos_pages(
    browser: Any, cluster: LocalCluster, screenshots: Path, tmp_path: Path
) -> None:
    """``raftlog console --connect-url --chaos-reports``, run in this process on the cluster."""
    _report(tmp_path / "kill-run", ok=True, seed=7)
    _report(tmp_path / "partition-run", ok=False, seed=8)
    with fake_connect_worker() as worker:
        console = Console(cluster.bootstrap_servers, connect_url=worker, chaos_reports=tmp_path)
        server = ConsoleServer(console, "127.0.0.163", 0).start()
        try:
            _connect_and_chaos(browser, server.url, screenshots)
        finally:
            server.stop()


def _connect_and_chaos(browser: Any, url: str, screenshots: Path) -> None:
    browser.get(f"{url}/connect")
    assert _cells(browser, 'tr[data-connector="lines-out"]')[3] == "PAUSED"
    browser.find_element(By.LINK_TEXT, "MirrorSourceConnector").click()
    assert browser.find_element(By.ID, "total-lag").text == "12"
    browser.save_screenshot(str(screenshots / "mirror.png"))
    browser.get(f"{url}/chaos")
    assert _cells(browser, 'tr[data-report="partition-run"]')[1] == "FAIL"
    assert _cells(browser, 'tr[data-report="kill-run"]')[1] == "PASS"
    browser.save_screenshot(str(screenshots / "chaos.png"))
    browser.find_element(By.LINK_TEXT, "kill-run").click()
    assert "seed 7" in browser.title  # chaos/report.py's report.html, served as written
