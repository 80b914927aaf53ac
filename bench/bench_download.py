"""Benchmark installer.download.fetch_file against curl over loopback.

    python3 bench/bench_download.py                 # 512 MiB and 64 MiB, 3 runs each
    python3 bench/bench_download.py --sizes 128 --runs 5
    python3 bench/bench_download.py --whole-process --sizes 1024 --runs 5 [--baseline DIR]

--whole-process times whole commands instead, start-up included: `installer download` (a new
Python process: imports, catalog, the transfer, SHA-256, fsync) against the SHA-256 floor
(`openssl dgst -sha256` of the same file, already in the page cache: what verifying costs with
no network and no disk) and `curl -o FILE URL && sync FILE` (no verification), on the same file;
then start-up: a 1 kB `installer download` against `python3 -c pass`, `installer --help` and a
warm `installer run` on an installed host root (as bench/bench_install.py builds it; skipped
where this machine has no Debian kernel headers or with --no-warm-run). The installer's
bytecode is compiled first, as in the images (pip compiles on install).

Creates random files (os.urandom: incompressible, honest for hashing), serves them from a
sendfile-based HTTP server in a separate process (so server and client never share a GIL),
then alternates `curl -o` and fetch_file (pinned SHA-256, so hashing is included; run in a
child process whose peak RSS is read from /proc/self/status VmHWM). Every run writes a fresh
file on the same filesystem. Prints a table of MB/s, the ratio to curl, and peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MiB = 1 << 20
REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- server process


def serve(root: Path) -> None:
    """Minimal HTTP/1.1 GET server using sendfile; prints its port, then serves forever."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)

    def handle(conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                request = reader.readline()
                if not request:
                    return
                target = request.split()[1].decode()
                start = 0
                while True:
                    line = reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.decode().partition(":")
                    if name.strip().lower() == "range":
                        start = int(value.split("=")[1].split("-")[0])
                path = root / target.lstrip("/")
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                size = os.fstat(fd).st_size
                if start:
                    head = (
                        f"HTTP/1.1 206 Partial Content\r\nContent-Length: {size - start}\r\n"
                        f"Content-Range: bytes {start}-{size - 1}/{size}\r\n\r\n"
                    )
                else:
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n"
                conn.sendall(head.encode())
                offset = start
                while offset < size:
                    sent = os.sendfile(conn.fileno(), fd, offset, size - offset)
                    if sent == 0:
                        break
                    offset += sent
                os.close(fd)
        except OSError:
            pass
        finally:
            conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


# ----------------------------------------------------------------------------- client process


def client(url: str, dest: Path, sha256: str) -> None:
    """Runs fetch_file once and prints timing and peak memory as JSON."""
    import logging

    sys.path.insert(0, str(REPO))
    from installer import delivery
    from installer.delivery import fetch as delivery_fetch

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    # requests/tenacity are imported lazily by the first download; load them before the clock
    # starts so the figure is the transfer (curl's time_total has no library loading either).
    import requests  # noqa: F401
    import tenacity  # noqa: F401

    fsync_seconds = 0.0
    real_fsync = os.fsync

    def timed_fsync(fd: int) -> None:
        nonlocal fsync_seconds
        t0 = time.perf_counter()
        real_fsync(fd)
        fsync_seconds += time.perf_counter() - t0

    delivery_fetch.os.fsync = timed_fsync  # type: ignore[attr-defined]
    settings = delivery.DownloadSettings(progress="log")
    started = time.perf_counter()
    got = delivery.fetch_file([url], dest, Path(url).name, sha256=sha256, settings=settings)
    seconds = time.perf_counter() - started
    status = Path("/proc/self/status").read_text()
    hwm_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    result = {
        "seconds": seconds,
        "fsync_seconds": fsync_seconds,
        "bytes": got.bytes_transferred,
        "hwm_kb": hwm_kb,
    }
    print(json.dumps(result))


# ----------------------------------------------------------------------------- driver


def make_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = os.urandom(min(MiB, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def run_curl(url: str, dest: Path) -> float:
    out = subprocess.run(
        ["curl", "-sS", "--fail", "-o", str(dest), "-w", "%{size_download} %{time_total}", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return int(out[0]) / float(out[1])


def run_ours(url: str, dest_dir: Path, sha256: str) -> tuple[float, float, float]:
    """(MB/s, MB/s leaving out the final fsync, peak RSS in MiB) of one fetch_file child."""
    proc = subprocess.run(
        [sys.executable, __file__, "--client", url, str(dest_dir), sha256],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    seconds, fsync = result["seconds"], result["fsync_seconds"]
    return result["bytes"] / seconds, result["bytes"] / (seconds - fsync), result["hwm_kb"] / 1024


TINY = "file-1kB.bin"
WHOLE_VERSION = "535.261.03"  # any version of the shipped catalog: the URL is overridden


def run_curl_sync(url: str, dest: Path) -> float:
    """Seconds of `curl -o FILE URL && sync FILE` as one shell command."""
    return run_timed(["sh", "-c", 'curl -sS --fail -o "$1" "$2" && sync "$1"', "sh", str(dest),
                      url])


def run_installer_download(url: str, dest_dir: Path, sha256: str, tree: Path = REPO) -> float:
    """Seconds of a whole `installer download` process for `url` (pinned, so verified), of
    the installer in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "NVIDIA_DRIVER_DOWNLOAD_URL": url,
           "NVIDIA_DRIVER_SHA256": sha256}
    return run_timed([sys.executable, "-m", "installer", "download", "--version", WHOLE_VERSION,
                      "--dest", str(dest_dir)], env)


def run_timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds of one whole process, its output discarded; its CPU seconds (and its
    children's) go to LAST_CPU (on a shared machine CPU seconds are the steadier figure)."""
    cpu = children_cpu()
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    LAST_CPU[0] = children_cpu() - cpu
    return wall


LAST_CPU = [0.0]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_line() -> str:
    flags = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines()
                  if line.startswith("model name")), "?")
    sha = "with" if " sha_ni" in flags else "without"
    openssl = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout.split()
    return (f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; {os.cpu_count()} CPUs ({model}, "
            f"{sha} SHA extensions); Python {sys.version.split()[0]}; curl {curl_version()}; "
            f"OpenSSL {openssl[1] if len(openssl) > 1 else '?'}; load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def whole_process(port: int, work: Path, serve_dir: Path, files: dict[str, str], runs_per: int,
                  warm_run: bool, baseline: Path | None) -> None:
    print(machine_line())
    for tree in (REPO, baseline) if baseline else (REPO,):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "installer")],
                       check=True)
    os.sync()  # the served files' writeback must not land inside a timed run
    base_head = " `installer download` s, baseline |" if baseline else ""
    print(f"| file | `openssl dgst -sha256` s (floor) | `curl -o && sync` s |{base_head} "
          "`installer download` s | floor / ours |")
    print("|---|---|---|---|---|" + ("---|" if baseline else ""))
    for name, pin in files.items():
        if name == TINY:
            continue
        url = f"http://127.0.0.1:{port}/{name}"
        served = serve_dir / name
        subprocess.run(["cat", str(served)], check=True, stdout=subprocess.DEVNULL)  # cached
        floor_s: list[float] = []
        curl_s: list[float] = []
        ours_s: list[float] = []
        base_s: list[float] = []
        cpu: dict[str, list[float]] = {}
        for run in range(runs_per):
            target = work / f"whole-{name}-{run}"
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            # rotate who goes first so page-cache and neighbour noise hit all three alike
            order = ["floor", "curl", "ours"] + (["base"] if baseline else [])
            order = order[run % len(order):] + order[:run % len(order)]
            for who in order:
                if who == "floor":
                    floor_s.append(run_timed(["openssl", "dgst", "-sha256", str(served)]))
                elif who == "curl":
                    curl_s.append(run_curl_sync(url, target / "curl.bin"))
                elif who == "base" and baseline is not None:
                    base_s.append(run_installer_download(url, target / "base", pin, baseline))
                else:
                    ours_s.append(run_installer_download(url, target / "ours", pin))
                cpu.setdefault(who, []).append(LAST_CPU[0])
            shutil.rmtree(target)
            os.sync()
        f, c, o = (statistics.median(x) for x in (floor_s, curl_s, ours_s))
        each = [", ".join(f"{x:.2f}" for x in xs) for xs in (floor_s, curl_s, ours_s, base_s)]
        base_cell = f" {statistics.median(base_s):.2f} ({each[3]}) |" if baseline else ""
        print(f"| {name} | {f:.2f} ({each[0]}) | {c:.2f} ({each[1]}) |{base_cell} "
              f"{o:.2f} ({each[2]}) | {f / o:.2f}x |")
        print("CPU seconds of each process and its children, median (runs): " + "; ".join(
            f"{who} {statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})"
            for who, xs in cpu.items()))
    print()
    start_up(port, work, files, runs_per, warm_run, baseline)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def start_up(port: int, work: Path, files: dict[str, str], runs_per: int, warm_run: bool,
             baseline: Path | None) -> None:
    """A 1 kB `installer download` against doing nothing, `--help` and a warm `installer run`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    url = f"http://127.0.0.1:{port}/{TINY}"
    series: dict[str, list[tuple[float, float]]] = {}

    def timed(what: str, wall: float) -> None:
        series.setdefault(what, []).append((wall, LAST_CPU[0]))

    warm = warm_host() if warm_run else None
    with warm or contextlib.nullcontext():
        for run in range(max(runs_per, 5)):
            timed("`python3 -c pass`", run_timed([sys.executable, "-c", "pass"]))
            timed("`python3 -c 'import requests'`",
                  run_timed([sys.executable, "-c", "import requests"]))
            timed("`installer --help`",
                  run_timed([sys.executable, "-m", "installer", "--help"], env))
            target = work / f"tiny-{run}"
            timed("1 kB `installer download`", run_installer_download(url, target, files[TINY]))
            shutil.rmtree(target)
            if baseline is not None:
                timed("1 kB `installer download`, baseline",
                      run_installer_download(url, target, files[TINY], baseline))
                shutil.rmtree(target)
            if warm is not None:
                timed("warm `installer run` (bench_install's host)", warm.run())
    print("| start-up, whole process | median wall s | median CPU s | runs: wall s (CPU s) |")
    print("|---|---|---|---|")
    for what, xs in series.items():
        wall = statistics.median(x[0] for x in xs)
        cpu = statistics.median(x[1] for x in xs)
        each = ", ".join(f"{w:.3f} ({c:.3f})" for w, c in xs)
        print(f"| {what} | {wall:.3f} | {cpu:.3f} | {each} |")


class WarmHost:
    """An installed host root (bench_install's: the fake-driver kit, real kbuild) to time warm
    `installer run` processes against; entering it does the cold install."""

    def __enter__(self) -> WarmHost:
        import kit
        from lib.hostkit import hidden_headers_argv, installer_env, make_debian_host
        from lib.httpfaults import serve_directory

        self._stack = contextlib.ExitStack()
        scratch = Path(self._stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bench-download-warm-")))
        version = "580.105.08"
        kit.build_runfile(version, scratch / "www" / version)
        kernel = make_debian_host(scratch / "host")
        base, _ = self._stack.enter_context(serve_directory(scratch / "www"))
        self._env = installer_env(scratch / "host", kernel, NVIDIA_DRIVER_VERSION=version,
                                  NVIDIA_DRIVER_MIRRORS=base)
        self._argv = hidden_headers_argv([sys.executable, "-m", "installer", "run"])
        self.run()  # the cold install
        return self

    def run(self) -> float:
        return run_timed(self._argv, self._env)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def warm_host() -> WarmHost | None:
    sys.path[:0] = [str(REPO / "tests")]
    from lib.hostkit import debian_headers

    if debian_headers() is None or shutil.which("unshare") is None:
        print("(no Debian kernel headers or no unshare here: no warm `installer run` series)")
        return None
    return WarmHost()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,64", help="file sizes in MiB, comma separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    parser.add_argument("--whole-process", action="store_true",
                        help="time whole `installer download` processes against curl && sync")
    parser.add_argument("--no-warm-run", action="store_true",
                        help="with --whole-process: skip the warm `installer run` series")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="with --whole-process: also time `installer download` from this "
                        "tree (e.g. `git archive main | tar -x -C DIR`), alternating")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.client:
        client(args.client[0], Path(args.client[1]), args.client[2])
        return
    if shutil.which("curl") is None:
        sys.exit("curl is needed for the comparison")

    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-download-", dir="/var/tmp"))
    serve_dir = work / "serve"
    serve_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    pins = {}
    for size in sizes:
        pins[size] = make_file(serve_dir / f"file-{size}.bin", size * MiB)

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(serve_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        if args.whole_process:
            files = {f"file-{size}.bin": pins[size] for size in sizes}
            files[TINY] = make_file(serve_dir / TINY, 1000)
            whole_process(port, work, serve_dir, files, args.runs, not args.no_warm_run,
                          args.baseline)
            return
        rows = []
        for size in sizes:
            url = f"http://127.0.0.1:{port}/file-{size}.bin"
            curl_rates: list[float] = []
            our_rates: list[float] = []
            no_fsync: list[float] = []
            peaks: list[float] = []
            for run in range(args.runs):
                target = work / f"run-{size}-{run}"
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir()
                # alternate who goes first so page-cache and neighbour noise hit both alike
                order = ("curl", "ours") if run % 2 == 0 else ("ours", "curl")
                for who in order:
                    if who == "curl":
                        curl_rates.append(run_curl(url, target / "curl.bin"))
                    else:
                        rate, rate_no_fsync, peak = run_ours(url, target / "ours", pins[size])
                        our_rates.append(rate)
                        no_fsync.append(rate_no_fsync)
                        peaks.append(peak)
                shutil.rmtree(target)
            rows.append((size, curl_rates, our_rates, no_fsync, peaks))
    finally:
        server.terminate()
        server.wait()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"curl {curl_version()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(
        "| file | curl MB/s | fetch_file MB/s (sha256 + fsync) | ratio | "
        "fetch_file MB/s without its fsync | ratio | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|")
    for size, curl_rates, our_rates, no_fsync, peaks in rows:
        c = statistics.median(curl_rates) / 1e6
        o = statistics.median(our_rates) / 1e6
        n = statistics.median(no_fsync) / 1e6
        print(
            f"| {size} MiB | {c:.0f} ({runs(curl_rates)}) | {o:.0f} ({runs(our_rates)}) | "
            f"{o / c:.2f}x | {n:.0f} ({runs(no_fsync)}) | {n / c:.2f}x | {max(peaks):.1f} MB |"
        )
    print("MB/s: median of the runs (each run in brackets); MB = 10^6 bytes; peak RSS = VmHWM")


def runs(rates: list[float]) -> str:
    return ", ".join(f"{r / 1e6:.0f}" for r in rates)


def curl_version() -> str:
    out = subprocess.run(["curl", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


if __name__ == "__main__":
    main()
