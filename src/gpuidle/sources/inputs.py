"""Where inputs come from: a local path or an fsspec URL (``s3://``, ``gs://``, ``az://``, ``hf://``, ``https://``...).

Every reader opens its input here, so a trace in object storage goes through the same
chunked reader as a local file: the remote file is read in order, each read fetching at
most :data:`READ_AHEAD` bytes beyond what the reader asked for (over HTTP, one streamed
response), and nothing is written to disk. Credentials are each filesystem's own (environment variables, config files,
instance roles); gpuidle never sees, prints or stores them, and only ever reads.

fsspec and the filesystem packages are imported on the first URL, so local analyses
never load them. A failure is one :class:`~gpuidle.errors.GpuidleError` that says what
went wrong (unknown scheme, missing package, no credentials, access denied, no such
bucket or object, unreachable endpoint) and how to fix it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import msgspec

from gpuidle.errors import CorruptInput, GpuidleError, InputNotFound, RemoteInputError

READ_AHEAD = 16 << 20
"""Bytes a remote file fetches beyond the reader's request: the memory a remote read adds. Each
fetch is one request; at 16 MiB a store's per-request latency costs little of its throughput."""

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+(::|://)")
_HASH_KEYS = ("ETag", "etag", "md5Hash", "Content-MD5", "content_md5", "blob_id", "Digest")
"""Info keys that identify a remote object's content, in the order tried (S3, GCS, HTTP, Azure, Hugging Face)."""
_INSTALL = {
    "s3": "pip install 'gpuidle[s3]'", "s3a": "pip install 'gpuidle[s3]'",
    "gs": "pip install 'gpuidle[gcs]'", "gcs": "pip install 'gpuidle[gcs]'",
    "http": "pip install 'gpuidle[remote]'", "https": "pip install 'gpuidle[remote]'",
    "az": "pip install adlfs", "abfs": "pip install adlfs", "abfss": "pip install adlfs",
    "hf": "pip install huggingface_hub",
}
_CREDENTIALS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (aws configure)",
    "gs": "run gcloud auth application-default login, or set GOOGLE_APPLICATION_CREDENTIALS",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
    "hf": "run huggingface-cli login, or set HF_TOKEN",
    "http": "the server refused the request; use a URL it serves without a login",
}
_SAME_CREDENTIALS = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "https": "http"}
_REMOTE_LIBRARIES = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google", "adlfs", "azure", "huggingface_hub",
                     "aiohttp", "requests", "urllib3", "fsspec")
"""Packages whose exceptions, raised while a remote file is read, are the remote side's failure."""


def is_url(path: str | Path) -> bool:
    """A URL fsspec opens (``scheme://`` or a chained ``scheme::``), not a local path."""
    return isinstance(path, str) and bool(_URL.match(path))


def display(url: str) -> str:
    """The URL without what could be a credential: a user/password part and the query string."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class RemoteFile(msgspec.Struct, frozen=True):
    """What identifies a remote input: its URL (credentials removed), size and content hash (ETag)."""

    url: str
    size: int | None
    etag: str | None


@contextmanager
def open_input(path: str | Path) -> Iterator[BinaryIO]:
    """Open a local file or a URL for reading, in binary; remote reads are buffered by :data:`READ_AHEAD`.

    A remote file is read front to back: an HTTP one cannot seek.
    """
    if not is_url(path):
        regular_size(str(path))  # a FIFO would block the open, a device never end
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as err:
            raise InputNotFound(f"{path}: cannot read ({err.strerror})") from None
        with f:
            yield f
        return
    url = str(path)
    fs, where = _filesystem(url)
    # HTTP: one streamed response (any server; no range requests). Object stores: ranged reads.
    streamed = _protocol(url) in ("http", "https")
    options: dict[str, Any] = {"block_size": 0} if streamed else {"block_size": READ_AHEAD, "cache_type": "readahead"}
    with _remote_errors(url):
        remote = fs.open(where, "rb", **options)
    try:
        with _remote_errors(url, reading=True):
            yield remote
    finally:
        remote.close()


TOO_LARGE_TO_READ_WHOLE = "a file read whole is not read that large; give a shorter span of it"


def read_bytes(path: str | Path, limit: int | None = None) -> bytes:
    """A whole small input (a counter log, a JSON report): local or remote; ``limit``: the most bytes it may hold,
    never more read.

    :raises CorruptInput: more than ``limit`` bytes.
    """
    with open_input(path) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise CorruptInput(f"{display(str(path)) if is_url(path) else path}: more than {limit >> 20} MiB",
                           TOO_LARGE_TO_READ_WHOLE)
    return data


def opened_size(f: BinaryIO) -> int:
    """The size of a file :func:`open_input` returned, 0 when the server does not say."""
    size = getattr(f, "size", None)
    if isinstance(size, int):
        return size
    try:
        return os.fstat(f.fileno()).st_size
    except (OSError, ValueError, AttributeError):
        return 0


def size(path: str | Path) -> int:
    """Bytes in a local file or a remote object (0 when a server does not say)."""
    if not is_url(path):
        return os.path.getsize(path)
    value = _info(str(path)).get("size")
    return value if isinstance(value, int) else 0


def describe(url: str) -> RemoteFile:
    """URL, size and content hash of a remote object, from its metadata alone (the object is not read)."""
    info = _info(url)
    value = info.get("size")
    etag = next((str(info[k]).strip('"') for k in _HASH_KEYS if info.get(k)), None)
    return RemoteFile(display(url), value if isinstance(value, int) else None, etag)


def list_files(path: str | Path, suffixes: tuple[str, ...], what: str) -> list[str]:
    """One file, or the files ending in ``suffixes`` directly inside a folder (a prefix, for object stores).

    :param what: names the files in the error for a folder without any, e.g. ``"trace files (*.json)"``.
    :raises InputNotFound: nothing there, or a folder without such files.
    """
    if not is_url(path):
        p = Path(path)
        try:
            mode = p.stat().st_mode
            if stat.S_ISREG(mode):
                return [str(p)]
            if not stat.S_ISDIR(mode):
                raise InputNotFound(f"{p}: not a regular file or folder", f"give one of the {what} or a folder of them")
            found = sorted(str(f) for f in p.iterdir() if f.name.endswith(suffixes) and _is_regular(f))
        except FileNotFoundError:
            raise InputNotFound(f"{p}: no such file or folder") from None
        except OSError as err:
            raise InputNotFound(f"{p}: cannot read ({err.strerror})") from None
    else:
        url = str(path)
        if not is_folder(url):
            return [url]
        fs, where = _filesystem(url)
        with _remote_errors(url):
            entries = fs.ls(where, detail=True)
        found = sorted(fs.unstrip_protocol(e["name"]) if "://" not in e["name"] else e["name"]
                       for e in entries if e.get("type") == "file" and str(e["name"]).endswith(suffixes))
    if not found:
        raise InputNotFound(f"{display(str(path)) if is_url(path) else path}: no {what} in this folder",
                            "point at the folder torch.profiler.tensorboard_trace_handler wrote")
    return found


def list_folders(path: str | Path) -> list[str]:
    """The folders directly inside a local folder, or the prefixes directly under a URL's prefix; none for a file.

    :raises InputNotFound: nothing there, or it cannot be read.
    """
    if not is_url(path):
        p = Path(path)
        try:
            return sorted(str(f) for f in p.iterdir() if f.is_dir()) if p.is_dir() else []
        except OSError as err:
            raise InputNotFound(f"{p}: cannot read ({err.strerror})") from None
    url = str(path)
    if _protocol(url) in ("http", "https") or not is_folder(url):
        return []  # a web server's folder listing is not a set of prefixes
    fs, where = _filesystem(url)
    with _remote_errors(url):
        entries = fs.ls(where, detail=True)
    return sorted((fs.unstrip_protocol(e["name"]) if "://" not in e["name"] else e["name"]).rstrip("/") + "/"
                  for e in entries if e.get("type") == "directory")


def regular_size(path: str) -> int:
    """The size of a regular file; anything else (a FIFO, a device, no permission) is a one-line error."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputNotFound(f"{path}: no such file or folder") from None
    except OSError as err:
        raise InputNotFound(f"{path}: cannot read ({err.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputNotFound(f"{path}: not a regular file", "give a trace file or a folder of them")
    return st.st_size


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return True  # listed but unreadable: reading it says why, and the folder goes on without it


def is_folder(url: str) -> bool:
    """A prefix to list. Over HTTP only a URL ending in ``/`` is (asking the server would fetch the file)."""
    if _protocol(url) in ("http", "https"):
        return url.endswith("/")
    return _info(url).get("type") == "directory"


def _info(url: str) -> dict[str, Any]:
    fs, where = _filesystem(url)
    with _remote_errors(url):
        fs.invalidate_cache(where)  # a listing cached earlier in this process may miss new files
        info: dict[str, Any] = fs.info(where)
    return info


def _protocol(url: str) -> str:
    return re.split(r"::|://", url, maxsplit=1)[0].lower()


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` (cached per process by fsspec) and the path inside it."""
    proto = _protocol(url)
    try:
        import fsspec
    except ImportError:
        raise RemoteInputError(f"{display(url)}: reading URLs needs fsspec, which is not installed",
                               _INSTALL.get(proto, "pip install 'gpuidle[remote]'")) from None
    try:
        return fsspec.core.url_to_fs(url)  # type: ignore[no-any-return]
    except ImportError as err:
        raise RemoteInputError(f"{display(url)}: the {proto}:// filesystem is not installed ({_one_line(err)})",
                               _INSTALL.get(proto, "install the fsspec filesystem package for it")) from None
    except ValueError as err:
        if "Protocol not known" in str(err):
            known = "s3://, gs://, az://, hf://, http(s)://"
            raise RemoteInputError(f"{display(url)}: unknown URL scheme {proto}://",
                                   f"give a local path or an fsspec URL ({known}, ...)") from None
        raise RemoteInputError(f"{display(url)}: not a valid URL ({_one_line(err)})") from None
    except Exception as err:  # a filesystem's own set-up failed (bad options in its config)
        raise _translate(url, err) from None


@contextmanager
def _remote_errors(url: str, reading: bool = False) -> Iterator[None]:
    """Turn the remote side's failures into one :class:`GpuidleError`.

    Setting up a request (``reading`` False) turns every failure into one; while the
    caller reads, only OS errors and the remote libraries' own errors are, so that a
    bug in a reader still shows as one.
    """
    try:
        yield
    except GpuidleError:
        raise
    except Exception as err:
        if reading and not (isinstance(err, OSError) or _from_remote_library(err)):
            raise
        raise _translate(url, err) from None


def _from_remote_library(err: Exception) -> bool:
    return any(type(e).__module__.split(".")[0] in _REMOTE_LIBRARIES for e in (err, err.__cause__) if e)


def _translate(url: str, err: Exception) -> GpuidleError:
    shown, proto = display(url), _protocol(url)
    creds = _CREDENTIALS.get(_SAME_CREDENTIALS.get(proto, proto), "check the filesystem's credentials")
    name = type(err).__name__
    cause = err.__cause__ or err.__context__
    status = getattr(err, "status", None) or getattr(err, "code", None)
    detail = _one_line(err).replace(url, shown)
    said = f" ({detail})" if detail not in (shown, url, url.split("://", 1)[-1]) else ""
    if "NoCredentials" in name or "DefaultCredentials" in name or "CredentialRetrieval" in name:
        return RemoteInputError(f"{shown}: no credentials found for {proto}://", creds)
    if _unreachable(err) or (cause is not None and _unreachable(cause)):
        reason = _one_line(cause if cause is not None and _unreachable(cause) else err).replace(url, shown)
        return RemoteInputError(f"{shown}: cannot reach the server ({reason})",
                                "check the network and the endpoint (AWS_ENDPOINT_URL_S3 for S3-compatible stores)")
    if isinstance(err, FileNotFoundError) or status == 404:
        what = "no such bucket" if "bucket" in detail.lower() else "no such object"
        return InputNotFound(f"{shown}: {what}{said}", "check the URL")
    if isinstance(err, PermissionError) or status in (401, 403):
        return RemoteInputError(f"{shown}: access denied{said}", f"the credentials in use may not read it: {creds}")
    return RemoteInputError(f"{shown}: cannot read ({name}: {detail})")


def _unreachable(err: BaseException) -> bool:
    """A failure to connect (refused, no route, DNS, time-out), from the OS or a remote library."""
    name = type(err).__name__
    return "Connect" in name or "Timeout" in name or isinstance(err, ConnectionError | TimeoutError)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."
