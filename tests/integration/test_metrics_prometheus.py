"""`installer metrics` scraped by a real Prometheus (Debian's prometheus package) on 127.0.0.1:
the series of an HGX node whose driver the installer verified (the kit's NVML answers for its
GPUs), every panel of the shipped Grafana dashboard run against that Prometheus, and the
shipped PrometheusRule's alerts under `promtool test rules`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit import fabric
from kit.fake_host import TEST_ROOT_ENV, FakeGpu, gpu_uuid, write_loaded_driver
from lib.hosttrees import make_host, root_env

from installer import state

REPO = Path(__file__).resolve().parents[2]
METRICS_DIR = REPO / "daemonset" / "components" / "metrics"
RULES_TEST = Path(__file__).parent / "prometheus" / "rules-test.yaml"
VERSION = "580.105.08"
INSTALL = "/home/kubernetes/bin/nvidia"
KERNEL, NEXT_KERNEL = "6.1.0-28-amd64", "6.1.0-29-amd64"
H100 = [FakeGpu("0000:18:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 0),
        FakeGpu("0000:2a:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 1),
        FakeGpu("0000:3b:00.0", 0x2330, "NVIDIA H100 80GB HBM3", 2)]
SWITCHES = [fabric.FakeSwitch("0000:05:00.0"), fabric.FakeSwitch("0000:06:00.0")]
P = "nvidia_driver_installer"


def _missing() -> str | None:
    for tool in ("prometheus", "promtool", "gcc", "makeself"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps)"
    return None


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    """Skipped where the tools are missing, failed under CI (which installs them)."""
    missing = _missing()
    if missing and os.environ.get("CI"):
        pytest.fail(missing)
    if missing:
        pytest.skip(missing)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hgx_node(root: Path, extracted: Path) -> Path:
    """An HGX H100 node after `installer run`: the driver verified and loaded, the kit's NVML
    in the install dir, GPU 0's fabric complete and GPU 1's still in progress, Fabric Manager
    up after 3 restarts, persistenced not up, a newer kernel installed and not yet prepared,
    and a last run that failed twice on the host lock after an install from the registry."""
    from kit import install_nvml

    make_host(root, distro="debian-12", kernel=KERNEL)
    write_loaded_driver(root, VERSION, H100)
    for switch in SWITCHES:
        fabric.write_pci_switch(root / "sys/bus/pci/devices", switch)
    fabric.write_driver_switches(root, SWITCHES)
    fabric.write_gpu_state(root, H100[0].address, persistence=True,
                           fabric_state=fabric.COMPLETED)
    fabric.write_gpu_state(root, H100[1].address, persistence=False,
                           fabric_state=fabric.IN_PROGRESS)
    # Registered, yet NVML's health summary says unhealthy: not a usable fabric either.
    fabric.write_gpu_state(root, H100[2].address, persistence=True,
                           fabric_state=fabric.COMPLETED, health_summary=fabric.UNHEALTHY)
    install = root / INSTALL.lstrip("/")
    install_nvml(extracted, install, VERSION)
    run = root / "run/nvidia-driver-installer"
    run.mkdir(parents=True)
    (run / "driver-ready").write_text(state.ready_text(VERSION, "open", INSTALL, KERNEL))
    (run / "fabricmanager-ready").write_text(
        f"DRIVER_VERSION={VERSION}\nSTATE=running\nPID=42\nFABRIC=completed,in-progress,completed\n")
    (run / "fabricmanager-restarts").write_text("3\n")
    state.write_record(install / "state.json", state.InstallRecord(
        version=VERSION, flavour="open", kernel=KERNEL, source="runfile", install_dir=INSTALL,
        kernels=(KERNEL,)))
    (install / "last-run.json").write_text(json.dumps({
        "format": 1, "outcome": "failure", "error": "lock-timeout", "failed_step": "",
        "version": VERSION, "flavour": "open", "kernel": KERNEL, "source": "runfile",
        "modules": "pulled", "phases": {"use-prebuilt-modules": 4.5, "load-modules": 1.25},
        "seconds": 9.5, "finished_at": "2026-11-27T04:00:00Z",
        "failures": {"lock-timeout": 2, "download-failed": 1}}))
    for path in (f"lib/modules/{NEXT_KERNEL}/modules.dep", f"boot/vmlinuz-{NEXT_KERNEL}"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    return root


class Prometheus:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """The exporter (`python -m installer metrics`) on the HGX node and a Prometheus scraping
    it every second (the alert rules loaded too), until it holds three scrapes."""
    from kit import extract_runfile

    work = tmp_path_factory.mktemp("metrics")
    root = hgx_node(work / "root", extract_runfile(VERSION, work / "runfile"))
    exporter_port, prom_port = free_port(), free_port()
    env = {**root_env(root, NVIDIA_INSTALL_DIR_HOST=INSTALL), TEST_ROOT_ENV: str(root),
           "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
    with open(work / "exporter.log", "wb") as log:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "installer", "metrics", "--listen",
             f"127.0.0.1:{exporter_port}", "--nvml-interval", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
    rules = work / "rules.yaml"
    subprocess.run([sys.executable, str(REPO / "scripts/prometheus_rules.py"),
                    str(METRICS_DIR / "prometheusrule.yaml"), str(rules)], check=True)
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "nvidia-driver-installer",
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"],
                                                "labels": {"node": "gpu-node-1"}}]}],
    }))
    with open(work / "prometheus.log", "wb") as log:
        server = subprocess.Popen(
            ["prometheus", f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=log)
    client = Prometheus(f"http://127.0.0.1:{prom_port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # Three scrapes: increase() over a range needs two samples at least.
                if client.query('count_over_time(up{job="nvidia-driver-installer"}[1m]) >= 3'
                                ' and up == 1'):
                    break
            except OSError:
                pass
            assert exporter.poll() is None, (work / "exporter.log").read_text()
            assert server.poll() is None, (work / "prometheus.log").read_text()
            assert time.monotonic() < deadline, (
                (work / "exporter.log").read_text() + (work / "prometheus.log").read_text())
            time.sleep(0.5)
        yield client
    finally:
        _stop(server)
        _stop(exporter)


def labels_of(result: list[dict[str, Any]], *keys: str) -> list[tuple[str, ...]]:
    return sorted(tuple(r["metric"].get(k, "") for k in keys) for r in result)


def test_prometheus_scrapes_the_nodes_driver(prom: Prometheus) -> None:
    assert prom.value(f"{P}_driver_ready") == 1
    assert prom.value(f"{P}_node_ready") == 0  # persistenced is not up
    info = prom.query(f"{P}_driver_info")
    assert labels_of(info, "version", "flavour", "kernel", "source", "node") == [
        (VERSION, "open", KERNEL, "runfile", "gpu-node-1")]
    assert prom.value(f'{P}_modules_source{{source="pulled"}}') == 1
    assert prom.value(f'{P}_modules_source{{source="compiled"}}') == 0
    assert prom.value(f'{P}_last_install_phase_duration_seconds{{phase="use-prebuilt-modules"}}'
                      ) == 4.5
    assert prom.value(f"{P}_last_install_duration_seconds") == 9.5
    assert prom.value(f"{P}_last_run_success") == 0
    assert labels_of(prom.query(f"{P}_last_run_info"), "outcome", "error") == [
        ("failure", "lock-timeout")]
    valid = prom.query(f"{P}_record_valid")
    assert {r["metric"]["record"]: float(r["value"][1]) for r in valid} == {
        "state": 1, "last-run": 1, "driver-ready": 1, "fabricmanager-ready": 1,
        "fabricmanager-restarts": 1, "persistenced-ready": 1, "persistenced-restarts": 1}
    failures = prom.query(f"{P}_failures_total")
    assert {r["metric"]["reference"]: float(r["value"][1]) for r in failures} == {
        "lock-timeout": 2, "download-failed": 1}


def test_gpus_fabric_and_persistence_come_from_nvml(prom: Prometheus) -> None:
    assert prom.value(f"{P}_fabric_required") == 1
    done = prom.query(f"{P}_gpu_fabric_completed")
    assert {(r["metric"]["gpu"], r["metric"]["uuid"]): float(r["value"][1]) for r in done} == {
        (H100[0].address, gpu_uuid(H100[0])): 1, (H100[1].address, gpu_uuid(H100[1])): 0,
        (H100[2].address, gpu_uuid(H100[2])): 0}
    assert labels_of(prom.query(f"{P}_gpu_fabric_state"), "gpu", "state") == [
        (H100[0].address, "completed"), (H100[1].address, "in-progress"),
        (H100[2].address, "completed")]
    persistence = prom.query(f"{P}_gpu_persistence_mode_enabled")
    assert {r["metric"]["gpu"]: float(r["value"][1]) for r in persistence} == {
        H100[0].address: 1, H100[1].address: 0, H100[2].address: 1}


def test_daemons_and_the_next_kernel(prom: Prometheus) -> None:
    up = prom.query(f"{P}_daemon_up")
    assert {r["metric"]["daemon"]: float(r["value"][1]) for r in up} == {
        "fabricmanager": 1, "persistenced": 0}
    assert prom.value(f'{P}_daemon_restarts_total{{daemon="fabricmanager"}}') == 3
    assert prom.value(f'{P}_daemon_restarts_total{{daemon="persistenced"}}') == 0
    assert prom.value(f"{P}_next_kernel_pending") == 1
    assert labels_of(prom.query(f"{P}_next_kernel_ready == 0"), "kernel") == [(NEXT_KERNEL,)]


def test_prometheus_loads_the_shipped_alert_rules(prom: Prometheus) -> None:
    with urllib.request.urlopen(f"{prom.base}/api/v1/rules", timeout=10) as answer:
        groups = json.load(answer)["data"]["groups"]
    assert sorted(r["name"] for g in groups for r in g["rules"]) == [
        "NvidiaDriverInstallFailing", "NvidiaDriverNotReady", "NvidiaDriverRecordInvalid",
        "NvidiaFabricManagerFlapping", "NvidiaFabricNotComplete"]
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads((METRICS_DIR / "dashboard.json").read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"]
            for target in panel["targets"]]


def test_every_dashboard_panel_answers(prom: Prometheus) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 10
    empty = [(title, expr) for title, expr in queries if not prom.query(expr)]
    assert empty == []
    by_title = {title: expr for title, expr in queries}
    fabric_left = prom.query(by_title["GPUs with the fabric not completed"])
    assert [(r["metric"]["node"], r["value"][1]) for r in fabric_left] == [("gpu-node-1", "2")]


def test_a_broken_panel_query_is_caught(prom: Prometheus) -> None:
    # The check above can fail: a misspelt metric answers nothing, bad PromQL is refused.
    assert prom.query(f"count by (version) ({P}_driver_infos)") == []
    with pytest.raises(urllib.error.HTTPError):
        prom.query(f"sum by (phase ({P}_last_install_phase_duration_seconds)")


def promtool_test(work: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    subprocess.run([sys.executable, str(REPO / "scripts/prometheus_rules.py"), str(manifest),
                    str(work / "nvidia-driver-installer.rules.yaml")], check=True)
    shutil.copy(RULES_TEST, work / RULES_TEST.name)
    return subprocess.run(["promtool", "test", "rules", RULES_TEST.name], cwd=work,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_shipped_alerts_pass_promtool(tmp_path: Path) -> None:
    result = promtool_test(tmp_path, METRICS_DIR / "prometheusrule.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_catches_an_alert_that_fires_too_early(tmp_path: Path) -> None:
    changed = tmp_path / "prometheusrule.yaml"
    text = (METRICS_DIR / "prometheusrule.yaml").read_text()
    changed.write_text(text.replace("for: 30m", "for: 20m", 1))
    result = promtool_test(tmp_path, changed)
    assert result.returncode == 1
    assert "NvidiaDriverNotReady" in result.stdout + result.stderr


def test_the_exporter_refuses_a_bad_listen_and_a_taken_port(tmp_path: Path) -> None:
    env = root_env(tmp_path, NVIDIA_INSTALL_DIR_HOST=INSTALL)
    bad = subprocess.run([sys.executable, "-m", "installer", "metrics", "--listen", "9402"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 106, bad.stderr
    assert "error[metrics-listen-invalid]" in bad.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = subprocess.run(
            [sys.executable, "-m", "installer", "metrics", "--listen", f"127.0.0.1:{port}"],
            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert taken.returncode == 108, taken.stderr
    assert "error[metrics-port-unavailable]" in taken.stderr
    assert "hint:" in taken.stderr and "Traceback" not in taken.stderr
