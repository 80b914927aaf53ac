"""What a .repo file must say before it reaches the host's /etc/yum.repos.d, and the host's own
NVIDIA repo files, which are refused when weak and never edited (installer/sources/dnf/repos.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.errors import HostRepoInsecure, RepoFileRefused
from installer.hostroot import HostRoot
from installer.sources.dnf import repos as dnf_repos

SHOWN = "https://mirror.example/cuda-rhel9.repo"
BASE = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64"
# NVIDIA's cuda-rhel9.repo as published.
NVIDIA = (f"[cuda-rhel9-x86_64]\nname=cuda-rhel9-x86_64\nbaseurl={BASE}\nenabled=1\n"
          f"gpgcheck=1\ngpgkey={BASE}/D42D0685.pub\n")


def check(text: str, local: bool = False, host_ids: dict[str, str] | None = None) -> str:
    return dnf_repos.check_repo_file(text, SHOWN, local=local, host_ids=host_ids)


def test_nvidias_own_repo_file_passes() -> None:
    assert check(NVIDIA) == "cuda-rhel9-x86_64"
    assert check(NVIDIA.replace("gpgcheck=1", "gpgcheck=True\nrepo_gpgcheck=1")) == (
        "cuda-rhel9-x86_64")
    assert check(NVIDIA.replace("enabled=1\n", "")) == "cuda-rhel9-x86_64"  # dnf's default
    local = NVIDIA.replace(f"baseurl={BASE}", "baseurl=file:///srv/cuda").replace(
        f"gpgkey={BASE}/D42D0685.pub", "gpgkey=file:///srv/cuda/D42D0685.pub")
    assert check(local, local=True) == "cuda-rhel9-x86_64"
    two_keys = NVIDIA.replace("D42D0685.pub", "D42D0685.pub,\n  file:///etc/pki/k.pub")
    assert check(two_keys) == "cuda-rhel9-x86_64"


@pytest.mark.parametrize(("text", "said"), [
    (NVIDIA.replace("gpgcheck=1", "gpgcheck=0"), "[cuda-rhel9-x86_64] has gpgcheck=0"),
    (NVIDIA.replace("gpgcheck=1\n", ""), "[cuda-rhel9-x86_64] has no gpgcheck="),
    (NVIDIA.replace("gpgcheck=1", "gpgcheck=1\nrepo_gpgcheck=0"), "has repo_gpgcheck=0"),
    (NVIDIA.replace("gpgcheck=1", "gpgcheck=1\nsslverify=false"), "has sslverify=false"),
    (NVIDIA.replace("gpgcheck=1", "gpgcheck=1\npkg_gpgcheck=no"), "has pkg_gpgcheck=no"),
    (NVIDIA.replace(f"gpgkey={BASE}/D42D0685.pub\n", ""), "names no signing key (gpgkey=)"),
    (NVIDIA.replace("gpgkey=https://", "gpgkey=http://"), "has gpgkey=http://developer"),
    (NVIDIA.replace("D42D0685.pub", "D42D0685.pub http://evil.example/k.pub"),
     "has gpgkey=http://evil.example/k.pub"),
    (NVIDIA.replace("baseurl=https://", "baseurl=http://"), "has baseurl=http://developer"),
    (NVIDIA.replace(f"baseurl={BASE}", "metalink=http://evil.example/ml"),
     "has metalink=http://evil.example/ml"),
    (NVIDIA.replace(f"baseurl={BASE}", "baseurl=file:///var/tmp/evil"),
     "has baseurl=file:///var/tmp/evil"),
    (NVIDIA.replace(f"baseurl={BASE}\n", ""), "has no baseurl, metalink or mirrorlist"),
    (NVIDIA.replace("enabled=1", "enabled=0"), "has enabled=0"),
    (NVIDIA + "[evil]\nbaseurl=https://evil.example/r\ngpgcheck=1\ngpgkey=https://evil/k\n",
     "defines 2 repos ([cuda-rhel9-x86_64], [evil])"),
    ("[DEFAULT]\nbaseurl=https://evil.example/r\n" + NVIDIA, "defines 2 repos ([DEFAULT]"),
    (NVIDIA + NVIDIA.replace("gpgcheck=1", "gpgcheck=0"), "is not a dnf .repo file"),
    ("<html>404</html>", "is not a dnf .repo file"),
    ("", "it has no [repo] section"),
])
def test_a_weak_or_foreign_repo_file_is_refused_naming_the_line(text: str, said: str) -> None:
    with pytest.raises(RepoFileRefused) as info:
        check(text)
    assert info.value.reference == "repo-file-refused" and info.value.exit_code == 63
    assert info.value.message.startswith(SHOWN) and said in info.value.message
    assert "gpgcheck=1" in info.value.hint and "Nothing was written" in info.value.hint


def test_a_fetched_repo_may_not_take_a_host_repos_id() -> None:
    with pytest.raises(RepoFileRefused, match=r"the id of the host's own repo in "
                       r"/etc/yum.repos.d/rocky.repo"):
        check(NVIDIA.replace("[cuda-rhel9-x86_64]", "[baseos]"), host_ids={"baseos": "rocky.repo"})


def test_a_credential_in_a_refused_url_is_not_shown() -> None:
    with pytest.raises(RepoFileRefused) as info:
        check(NVIDIA.replace("baseurl=https://", "baseurl=http://user:secret@"))
    assert "secret" not in info.value.message and "//***@" in info.value.message


def host(tmp_path: Path, files: dict[str, str], dnf_conf: str | None = None) -> HostRoot:
    repos = tmp_path / "etc/yum.repos.d"
    repos.mkdir(parents=True)
    for name, text in files.items():
        (repos / name).write_text(text)
    if dnf_conf is not None:
        (tmp_path / "etc/dnf").mkdir(parents=True)
        (tmp_path / "etc/dnf/dnf.conf").write_text(dnf_conf)
    return HostRoot(tmp_path)


def test_the_hosts_unsigned_nvidia_repo_is_found_and_refused(tmp_path: Path) -> None:
    weak = NVIDIA.replace("gpgcheck=1", "gpgcheck=0")
    root = host(tmp_path, {"cuda-rhel9.repo": weak, "epel.repo": "[epel]\nbaseurl=x\n"})
    found = dnf_repos.unsigned_host_repo(root)
    assert found is not None and (found.file, found.repo_id) == ("cuda-rhel9.repo",
                                                                  "cuda-rhel9-x86_64")
    error = dnf_repos.refuse_unsigned_host_repo(found)
    assert isinstance(error, HostRepoInsecure) and error.exit_code == 64
    assert "/etc/yum.repos.d/cuda-rhel9.repo enables [cuda-rhel9-x86_64] without gpgcheck=1" in (
        error.message)
    assert "does not edit" in error.hint


def test_dnf_conf_main_gpgcheck_counts_for_a_section_without_one(tmp_path: Path) -> None:
    silent = NVIDIA.replace("gpgcheck=1\n", "")
    root = host(tmp_path, {"cuda-rhel9.repo": silent}, "[main]\ngpgcheck=1\n")
    assert dnf_repos.unsigned_host_repo(root) is None
    (tmp_path / "etc/dnf/dnf.conf").write_text("[main]\ngpgcheck=0\n")
    assert dnf_repos.unsigned_host_repo(root) is not None
    assert dnf_repos.unsigned_host_repo(host(tmp_path / "b", {"cuda-rhel9.repo": NVIDIA})) is None


def test_a_disabled_or_other_unsigned_repo_is_not_the_nvidia_repo(tmp_path: Path) -> None:
    root = host(tmp_path, {
        "cuda-rhel9.repo": NVIDIA.replace("gpgcheck=1", "gpgcheck=0").replace("enabled=1",
                                                                               "enabled=0"),
        "epel.repo": "[epel]\nbaseurl=file:///srv/epel\ngpgcheck=0\n"})
    assert dnf_repos.unsigned_host_repo(root) is None
    found = dnf_repos.unsigned_host_repo(root, "epel.repo")  # when it is the one relied on
    assert found is not None and found.repo_id == "epel"


@pytest.mark.parametrize(("text", "said"), [
    # dnf reads option names as written: GPGCHECK is not gpgcheck to it, so the repo would
    # fall back to [main]'s gpgcheck (off unless set) while configparser saw gpgcheck=1.
    (NVIDIA.replace("gpgcheck=1", "GPGCHECK=1"), "option GPGCHECK"),
    (NVIDIA.replace("gpgcheck=1", "gpgcheck=1\nGpgCheck=0"), "option GpgCheck"),
    (NVIDIA.replace("gpgkey=", "GPGKEY="), "option GPGKEY"),
    (NVIDIA.replace("baseurl=", "BaseURL="), "option BaseURL"),
])
def test_an_option_name_dnf_would_not_read_is_refused(text: str, said: str) -> None:
    with pytest.raises(RepoFileRefused) as info:
        check(text)
    assert info.value.message.startswith(SHOWN) and said in info.value.message
    assert "lowercase" in info.value.message


@pytest.mark.parametrize("section", ["main", "DEFAULT"])
def test_a_section_dnf_does_not_read_as_a_repo_is_refused(section: str) -> None:
    with pytest.raises(RepoFileRefused) as info:
        check(NVIDIA.replace("[cuda-rhel9-x86_64]", f"[{section}]"))
    assert f"[{section}]" in info.value.message and "not a repo id" in info.value.message


def test_the_hosts_repo_with_an_uppercase_gpgcheck_is_unsigned_to_dnf(tmp_path: Path) -> None:
    shouted = NVIDIA.replace("gpgcheck=1", "GPGCHECK=1")
    root = host(tmp_path, {"cuda-rhel9.repo": shouted}, "[main]\ngpgcheck=0\n")
    found = dnf_repos.unsigned_host_repo(root)
    assert found is not None and found.repo_id == "cuda-rhel9-x86_64"
    (tmp_path / "etc/dnf/dnf.conf").write_text("[main]\nGPGCHECK=1\n")  # dnf ignores it too
    assert dnf_repos.unsigned_host_repo(root) is not None
    (tmp_path / "etc/dnf/dnf.conf").write_text("[main]\ngpgcheck=1\n")
    assert dnf_repos.unsigned_host_repo(root) is None


def test_a_repo_url_redirected_from_https_to_plain_http_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA_DNF_REPO_URL over https that answers 302 to http://: the .repo decides which key
    dnf trusts, so bytes that came over plain http are not written, even if they look right."""
    from lib.dnfplans import plan_for, step
    from lib.fakes import FakeRunner
    from lib.httpfaults import FaultServer
    from lib.tlskit import make_tls

    from installer.errors import RepoUnavailable

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    tls = make_tls(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    host_root = tmp_path / "host"
    with FaultServer() as plain, FaultServer(tls=tls.context) as origin:
        plain.add("/cuda-rhel9.repo", NVIDIA.encode())
        origin.add("/cuda-rhel9.repo", status=302,
                   headers={"Location": plain.url("/cuda-rhel9.repo")})
        plan = plan_for(host_root, FakeRunner(), NVIDIA_DNF_REPO_URL=origin.url("/cuda-rhel9.repo"),
                        NVIDIA_INSTALLER_RETRIES="1")
        with pytest.raises(RepoUnavailable, match=r"redirected to http://127\.0\.0\.1"):
            step(plan, "add-dnf-repo").apply()
    assert not (host_root / "etc/yum.repos.d/cuda-rhel9.repo").exists()
