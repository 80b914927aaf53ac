"""The .repo files dnf and zypper share (INI, one section per repository): read keeping the
keys' case and the values' `$releasever`, pointed at a mirror, written back."""

from __future__ import annotations

import configparser
import io


def parsed(text: str) -> configparser.ConfigParser:
    """`text` as sections; raises configparser.Error for a file that is not one."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def point_at_mirror(parser: configparser.ConfigParser, mirror: str) -> None:
    """Every repository's packages from `<mirror>/<repo id>/`: its mirror lists dropped."""
    for section in parser.sections():
        repo = parser[section]
        for key in ("mirrorlist", "metalink"):
            repo.pop(key, None)
        repo["baseurl"] = f"{mirror.rstrip('/')}/{section}/"


def written(parser: configparser.ConfigParser) -> str:
    out = io.StringIO()
    parser.write(out)
    return out.getvalue()
