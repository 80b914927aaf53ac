"""URLs: schemes, local paths, credentials kept out of every message."""

from __future__ import annotations

import re
from io import BufferedReader
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from installer.errors import DownloadFailed, DownloadForbidden, DownloadNotFound

SUPPORTED_SCHEMES = ("http", "https", "file")
# Query parameters that carry secrets in signed URLs (S3 X-Amz-Signature/Credential, GCS
# X-Goog-Signature, Azure SAS `sig`, plain `token=`/`key=`).
_SECRET_QUERY_KEY_RE = r"(?i)sig|signature|token|key|secret|password|passwd|credential|auth"


def control_character(url: str) -> str | None:
    """The first control character in `url` and where, e.g. `'\\n' at 31`, or None."""
    if url.isprintable():  # no control character (all are unprintable): one C call per URL
        return None
    for index, char in enumerate(url):
        if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            return f"{char!r} at {index}"
    return None


def check_url(url: str) -> None:
    """Raises DownloadFailed for a URL holding control characters (a pasted newline, a tab).

    urllib3 would quote or refuse them later with a misleading 404 or error."""
    bad = control_character(url)
    if bad is not None:
        raise DownloadFailed(
            f"{redact_url(url)!r}: control character {bad} in the URL",
            hint="Remove the newline, tab or other control character from the URL.",
        )


def redact_url(url: str) -> str:
    """`url` safe to log: `user:pass@` becomes `***@` and secret-looking query values `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        items = []
        for item in query.split("&"):
            name, sep, value = item.partition("=")
            if sep and value and re.search(_SECRET_QUERY_KEY_RE, unquote(name)):
                value = "***"
            items.append(f"{name}{sep}{value}")
        query = "&".join(items)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def secrets_of(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found.append(userinfo)
        for piece in userinfo.split(":"):
            found.extend([piece, unquote(piece)])
    for item in parts.query.split("&"):
        name, sep, value = item.partition("=")
        if sep and value and re.search(_SECRET_QUERY_KEY_RE, unquote(name)):
            found.extend([value, unquote(value)])
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """Remove `url`'s credentials from a message written by a library."""
    text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, "***")
    return text


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without userinfo, and the (user, password) it carried, if any."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, (unquote(user), unquote(password))


def local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise DownloadFailed(
            f"{redact_url(url)}: file:// URLs must name a local path (file:///path)",
            hint="Write file:///path/to/file (three slashes) for a file on this node.",
        )
    return Path(unquote(parts.path))


def open_local(url: str) -> BufferedReader:
    """The file a file:// URL names, open for reading. Raises DownloadNotFound (no such file),
    DownloadForbidden (unreadable), DownloadFailed (any other error)."""
    red = redact_url(url)
    try:
        return local_path(url).open("rb")
    except FileNotFoundError:
        raise DownloadNotFound(f"{red}: no such file") from None
    except PermissionError:
        raise DownloadForbidden(f"{red}: permission denied") from None
    except OSError as exc:
        raise DownloadFailed(f"{red}: {exc.strerror or exc}") from None


def scheme_of(url: str) -> str:
    """The URL's scheme after checking it is supported and free of control characters."""
    check_url(url)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise DownloadFailed(
            f"{redact_url(url)}: unsupported URL scheme {scheme or '(none)'!r}",
            hint="Use an http://, https:// or file:// URL.",
        )
    return scheme


def remote_name(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])

