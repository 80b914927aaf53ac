"""The warm path imports only what it runs: a second `installer run` on an installed host (and a
plain `import installer.app`) loads none of the dnf source, the apt/dnf header fetchers, the
download machinery, the registry, the cluster client, pynvml or click (DESIGN: heavy imports
lazily)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kit
import pytest
from lib.hostkit import (
    REPO,
    debian_headers,
    hidden_headers_argv,
    installer_env,
    make_debian_host,
    run_installer,
)
from lib.httpfaults import serve_directory

VERSION = "580.105.08"

# Module name prefixes the warm path must never load.
NOT_ON_THE_WARM_PATH = (
    "installer.sources.dnf",  # steps, commands, metadata (sqlite3, configparser, lzma), ...
    "installer.distros.apt",  # the families' header fetchers
    "installer.distros.dnf",
    "installer.delivery.cache",
    "installer.delivery.fetch",
    "installer.delivery.part",
    "installer.delivery.transport",
    "installer.delivery.small",
    "installer.delivery.retry",
    "installer.delivery.checksums",
    "installer.delivery.registry",
    "installer.cluster",  # the API client, the protocol, the gate (not the two below)
    "installer.verify",
    "requests",
    "urllib3",
    "tenacity",
    "oras",
    "yaml",
    "pynvml",
    "ctypes",  # the CUDA check's (verify is not asked again on the warm path)
    "sqlite3",
    "installer.metrics",  # `installer metrics` and the Prometheus client: a container's own
    "prometheus_client",
    "click",  # a bare `installer run` needs no flag parsing, and click is slow to import
)


def imported(importtime_stderr: str) -> set[str]:
    """Module names from `python -X importtime` lines (`import time: self | total | name`)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    return names


# Rooms whose door or registration the warm path needs, the rest of the room forbidden. The
# cluster room's run-time side: what stands between a held driver and its unload, and the gate
# steps in a plan. They touch the API server only through installer.cluster's other modules,
# imported inside functions when the protocol or the gate is on.
ON_THE_WARM_PATH = {"installer.cluster", "installer.cluster.upgrade_gate",
                    "installer.cluster.scheduling_gate_steps",
                    # the dnf source's answers (offered where, its evidence): the registry asks
                    # every source, as it asked via_dnf before the rooms; its door is empty
                    "installer.sources.dnf", "installer.sources.dnf.source"}


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.startswith(NOT_ON_THE_WARM_PATH)
                  and n not in ON_THE_WARM_PATH)


def test_importing_the_application_loads_none_of_the_heavy_modules() -> None:
    code = "import installer.cli, installer.app, installer.planner"
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                            text=True, check=True, timeout=120, cwd=REPO,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    names = imported(result.stderr)
    assert "installer.planner" in names and "installer.sources.runfile.steps" in names
    assert forbidden(names) == []


@pytest.mark.skipif(debian_headers() is None, reason="needs linux-headers-amd64")
def test_a_warm_run_imports_only_what_it_runs(tmp_path: Path) -> None:
    www = tmp_path / "www"
    kit.build_runfile(VERSION, www / VERSION)
    root = tmp_path / "host"
    kernel = make_debian_host(root)
    with serve_directory(www) as (base, _):
        env = installer_env(root, kernel, NVIDIA_DRIVER_VERSION=VERSION,
                            NVIDIA_DRIVER_MIRRORS=base, NVIDIA_DRIVER_DIGESTS_FILE=str(
                                kit.write_digests(tmp_path / "digests", www)))
        cold = run_installer(env, "run")
        assert cold.returncode == 0, cold.stderr[-3000:]
        warm = subprocess.run(
            hidden_headers_argv([sys.executable, "-X", "importtime", "-m", "installer", "run"]),
            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "every step was already satisfied" in warm.stderr
    names = imported(warm.stderr)
    # The cold run needed them; the warm one does not.
    assert "installer.sources.runfile.steps" in names and "installer.cli" in names
    assert forbidden(names) == []


def test_the_delivery_door_still_exports_every_name() -> None:
    import importlib

    from installer import delivery

    assert set(delivery._EXPORTS) <= set(delivery.__all__)
    for name, module in delivery._EXPORTS.items():
        defined = getattr(importlib.import_module(f"installer.delivery.{module}"), name)
        assert getattr(delivery, name) is defined
    # The rest of the door's list are modules other rooms import whole.
    for name in set(delivery.__all__) - set(delivery._EXPORTS):
        assert (Path(delivery.__file__).parent / f"{name}.py").is_file(), name
    with pytest.raises(AttributeError):
        _ = delivery.no_such_name
