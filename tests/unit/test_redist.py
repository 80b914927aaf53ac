"""installer/components/redist.py: the one lookup in NVIDIA's redist trees that Fabric Manager,
IMEX and NVLSM share: bases in order, a trusted origin's JSON preferred, a 404 passed over, a
redirect off the trusted origins vouching for nothing; and the only caller of fetch_listing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from installer import delivery
from installer.components import fm_archive, redist
from installer.config import from_env
from installer.errors import (
    DownloadNotFound,
    FabricManagerUnavailable,
    ImexUnavailable,
    InstallerError,
)

V = "580.105.08"
MIRROR = "http://mirror.test/redist"
TRUSTED = "https://trusted.test/redist"
OTHER = "https://other.test/redist"
INSTALLER = Path(__file__).resolve().parents[2] / "installer"


def listing(sha: str) -> bytes:
    name = fm_archive.archive_name(V, "x86_64")
    return json.dumps({"fabricmanager": {"version": V, "linux-x86_64": {
        "relative_path": f"fabricmanager/linux-x86_64/{name}", "sha256": sha * 64,
        "size": "10"}}}).encode()


class Served:
    """fetch_listing as vouch.py documents it: the bytes at a URL and whether every hop was
    https on a trusted origin (`off_trust`: URLs that redirect off the trusted origins);
    DownloadNotFound for a URL nothing serves."""

    def __init__(self, files: dict[str, bytes], off_trust: tuple[str, ...] = ()) -> None:
        self.files, self.off_trust = files, off_trust
        self.asked: list[str] = []

    def __call__(self, url: str, settings: object, *, max_bytes: int) -> tuple[bytes, bool]:
        self.asked.append(url)
        base = url.rsplit("/", 1)[0]
        if base not in self.files:
            raise DownloadNotFound(f"{url}: HTTP 404")
        return self.files[base], base.startswith(TRUSTED) and base not in self.off_trust


def lookup(monkeypatch: pytest.MonkeyPatch, served: Served, bases: list[str], *,
           need_trusted: bool = True,
           pass_over: tuple[type[InstallerError], ...] = ()) -> redist.Lookup:
    monkeypatch.setattr(delivery, "fetch_listing", served)
    config = from_env({"NVIDIA_FABRICMANAGER_REDIST": ",".join(bases),
                       "NVIDIA_DRIVER_TRUSTED_ORIGINS": "https://trusted.test"})
    return redist.lookup(config, V, lambda data, where: fm_archive.parse_manifest(
        data, V, "x86_64", where), need_trusted=need_trusted, pass_over=pass_over)


def test_a_trusted_origins_listing_is_preferred_to_an_earlier_mirrors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({MIRROR: listing("a"), TRUSTED: listing("b")})
    found = lookup(monkeypatch, served, [MIRROR, TRUSTED])
    assert found.listed is not None
    assert (found.listed.sha256, found.listed.trusted) == ("b" * 64, True)
    assert found.listed.where == f"{TRUSTED}/redistrib_{V}.json"


def test_without_need_trusted_the_first_listing_is_taken_and_no_other_base_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({MIRROR: listing("a"), TRUSTED: listing("b")})
    found = lookup(monkeypatch, served, [MIRROR, TRUSTED], need_trusted=False)
    assert found.listed is not None
    assert (found.listed.sha256, found.listed.trusted) == ("a" * 64, False)
    assert served.asked == [f"{MIRROR}/redistrib_{V}.json"]


def test_a_trusted_base_that_redirects_off_the_trusted_origins_vouches_for_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({MIRROR: listing("a"), TRUSTED: listing("b")}, off_trust=(TRUSTED,))
    found = lookup(monkeypatch, served, [MIRROR, TRUSTED])
    # The first listing stays: the redirected one is no better than the mirror's.
    assert found.listed is not None
    assert (found.listed.sha256, found.listed.trusted) == ("a" * 64, False)


def test_once_found_a_base_off_the_trusted_origins_is_not_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({MIRROR: listing("a"), OTHER: listing("c")})
    lookup(monkeypatch, served, [MIRROR, OTHER])
    assert served.asked == [f"{MIRROR}/redistrib_{V}.json"]


def test_a_missing_json_is_passed_over_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({TRUSTED: listing("b")})
    found = lookup(monkeypatch, served, [MIRROR, TRUSTED])
    assert found.listed is not None and found.listed.trusted
    nothing = lookup(monkeypatch, Served({}), [MIRROR])
    assert nothing.listed is None
    assert nothing.tried == f"{MIRROR}/redistrib_{V}.json (HTTP 404)"


def test_a_listing_without_the_entry_is_passed_over_only_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served({MIRROR: b'{"imex": {}}', TRUSTED: listing("b")})
    with pytest.raises(FabricManagerUnavailable, match="lists no fabricmanager archive"):
        lookup(monkeypatch, served, [MIRROR, TRUSTED])
    found = lookup(monkeypatch, served, [MIRROR, TRUSTED],
                   pass_over=(FabricManagerUnavailable, ImexUnavailable))
    assert found.listed is not None and found.listed.trusted
    assert "lists no fabricmanager archive for linux-x86_64" in found.tried
    assert [type(exc) for exc in found.passed_over] == [FabricManagerUnavailable]


def test_only_redist_reads_a_redistrib_json() -> None:
    readers = sorted(str(path.relative_to(INSTALLER)) for path in INSTALLER.rglob("*.py")
                     if re.search(r"\bfetch_listing\(", path.read_text())
                     and path.parent.name != "delivery")
    assert readers == ["components/redist.py"]
