"""The .run header: Debian's installed makeself header with NVIDIA's argument handling spliced in.

Generated at build time from /usr/share/makeself; nothing of makeself is stored in the repo.
"""

from __future__ import annotations

from pathlib import Path

STOCK_HEADER = Path("/usr/share/makeself/makeself-header.sh")
PREPARSE = Path(__file__).with_name("runfile_preparse.sh")
# Stock makeself 2.4.5 text the splice relies on; a changed makeself fails loudly here.
OPTION_LOOP_START = 'initargs="\\$@"'
STOCK_TMPROOT = "TMPROOT=\\${TMPDIR:=/tmp}"
NVIDIA_TMPROOT = "TMPROOT=\\${TMPDIR:-/tmp}"


def escape_for_heredoc(shell: str) -> str:
    """The header is the body of an unquoted `cat << EOF`, so $, ` and \\ must be escaped."""
    return shell.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")


def header_text(version: str, arch: str = "x86_64") -> str:
    stock = STOCK_HEADER.read_text()
    for anchor in (OPTION_LOOP_START, STOCK_TMPROOT):
        if stock.count(anchor) != 1:
            raise RuntimeError(f"{STOCK_HEADER}: expected one {anchor!r}; makeself changed?")
    preparse = escape_for_heredoc(PREPARSE.read_text().replace("@VERSION@", version)
                                  .replace("@ARCH@", arch))
    spliced = stock.replace(OPTION_LOOP_START, preparse + OPTION_LOOP_START)
    return spliced.replace(STOCK_TMPROOT, NVIDIA_TMPROOT)


def write_header(version: str, path: Path, arch: str = "x86_64") -> Path:
    path.write_text(header_text(version, arch))
    return path
