"""API keys for the HTTP API: who may call it, and how much each key may ask for.

A keys file holds one key a line, optionally with its limits:

    sk-team-a                        # the default limits
    sk-batch  concurrency=4 per_hour=500 name=batch-runner

`concurrency` is how many of the key's jobs may be unfinished at once (waiting or running);
`per_hour` is how many jobs the key may submit in any rolling hour. Either one exceeded is answered
with HTTP 429. Keys are compared in constant time and only a hash of each is kept in memory.

The file is re-read when it changes (its modification time, size or inode, looked at no more than once
a second): a key removed from it stops working within a second or two, without a restart. A file that
no longer reads (emptied, a bad line, gone) closes the API until it is fixed; the old keys do not linger.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CONCURRENCY = 2
DEFAULT_PER_HOUR = 120
_LIMIT_KEYS = ("concurrency", "per_hour", "name")
ANONYMOUS = "anonymous"
RECHECK_S = 1.0  # how often the keys file's stamp is looked at
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApiKey:
    name: str  # what logs and job owners show: never the key itself
    digest: bytes
    concurrency: int = DEFAULT_CONCURRENCY
    per_hour: int = DEFAULT_PER_HOUR


class Unauthorized(Exception):
    """No key, or a key that is not configured; the message says which."""


class LimitExceeded(Exception):
    """A key is over one of its limits; `retry_after_s` is when trying again can succeed."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _positive(text: str, what: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{where}: {what} must be a whole number >= 1, got {text!r}.")
    return value


def parse_key_line(line: str, where: str) -> ApiKey:
    """`KEY [concurrency=N] [per_hour=N] [name=TEXT]` -> ApiKey (the name defaults to a key prefix)."""
    key, *options = line.split()
    if len(key) < 8:
        raise ValueError(f"{where}: a key must be at least 8 characters long, got {len(key)}.")
    limits: dict = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or name not in _LIMIT_KEYS or not value:
            raise ValueError(f"{where}: unknown option {option!r}; allowed: {', '.join(k + '=...' for k in _LIMIT_KEYS)}.")
        limits[name] = value if name == "name" else _positive(value, name, where)
    name = limits.pop("name", None) or f"key-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    return ApiKey(name=name, digest=_digest(key), **limits)


def entry_lines(path: Path, flag: str, what: str) -> list[tuple[int, str]]:
    """The entries of a file that `flag` names, one a line, as (line number, stripped line): blank lines
    and lines starting with `#` are skipped. An unreadable file, or one with no entry (`what` says what
    an entry is), is refused naming the flag. Serves this module's keys file and app.py's --auth-file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {str(path)!r} could not be read: {exc}") from None
    entries = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)
               if line.strip() and not line.strip().startswith("#")]
    if not entries:
        raise ValueError(f"{flag} {str(path)!r} holds no {what}")
    return entries


class KeysFile(list):
    """The keys a file held when it was read, with the file and its stamp: a KeyRing built from these
    re-reads the file when it changes."""

    def __init__(self, keys: list[ApiKey], path: Path, stamp: tuple | None):
        super().__init__(keys)
        self.path, self.stamp = path, stamp


def file_stamp(path: Path) -> tuple | None:
    """What changes when the file is edited or replaced; None when it cannot be looked at."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino


def read_keys_file(path: str | Path) -> KeysFile:
    """Keys from a file (blank lines and `#` comments, also after a key, skipped); a file with no key is refused."""
    path = Path(path).expanduser()
    stamp = file_stamp(path)  # taken before reading: an edit during the read is seen at the next look
    keys = [parse_key_line(line.split("#", 1)[0].strip(), f"--api-keys {str(path)!r}, line {number}")
            for number, line in entry_lines(path, "--api-keys", "key")]
    return KeysFile(keys, path, stamp)


def keys_from_env(text: str) -> list[ApiKey]:
    """COSMOS3_API_KEYS="key1,key2" -> keys with the default limits."""
    return [parse_key_line(item.strip(), "COSMOS3_API_KEYS") for item in text.split(",") if item.strip()]


def configured_keys(path: str | None, listed: str = "") -> list[ApiKey]:
    """The keys a server runs with: the file if given, else `listed` (`COSMOS3_API_KEYS`, from
    `engine.config.AuthConfig.api_keys`), else none (open)."""
    if path:
        return read_keys_file(path)
    return keys_from_env(listed)


def _check_unique(keys: list[ApiKey]) -> None:
    names = [k.name for k in keys]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"API key names must be unique; repeated: {repeated}.")


@dataclass
class _Usage:
    unfinished: set = field(default_factory=set)  # job ids
    submitted: deque = field(default_factory=deque)  # monotonic times within the last hour


class KeyRing:
    """Checks `Authorization: Bearer KEY` headers and each key's limits.

    With no keys configured the API is open and every caller is the one owner `anonymous`, with the
    default limits; unless `closed_reason` is given (the UI has a login), when every call is refused
    with that reason, so that the API is never the way around the UI's login.
    """

    def __init__(self, keys: list[ApiKey], clock=time.monotonic, closed_reason: str | None = None):
        _check_unique(keys)
        self.keys = list(keys)
        self._clock = clock
        self._lock = threading.Lock()
        self._usage: dict[str, _Usage] = {}
        self._open = ApiKey(name=ANONYMOUS, digest=b"")
        self.closed_reason = None if keys else closed_reason
        self._source = keys if isinstance(keys, KeysFile) else None  # re-read when it changes
        self._stamp = getattr(keys, "stamp", None)
        self._looked_at = clock()
        self._unreadable = False

    @property
    def required(self) -> bool:
        return bool(self.keys) or self._source is not None

    def _reread_if_changed(self) -> None:
        """Take the keys file's current keys if it changed since it was last read (at most one look a
        second). A file that no longer reads refuses every call until it does: never the old keys."""
        with self._lock:
            now = self._clock()
            if self._source is None or now - self._looked_at < RECHECK_S:
                return
            self._looked_at = now
            stamp = file_stamp(self._source.path)
            if stamp == self._stamp and not self._unreadable:
                return
            self._stamp = stamp
            try:
                keys = read_keys_file(self._source.path)
                _check_unique(keys)
            except ValueError as exc:
                log.error("The API keys file changed and does not read; every /v1 call is refused until "
                          "it does: %s", exc)
                self.keys, self._unreadable = [], True
                return
            self.keys, self._unreadable, self._stamp = list(keys), False, keys.stamp
            log.info("Re-read the API keys file: %d keys", len(keys))

    def authenticate(self, authorization: str | None) -> ApiKey:
        if self.closed_reason:
            raise Unauthorized(self.closed_reason)
        self._reread_if_changed()
        if self._unreadable:
            raise Unauthorized("The server's API keys file changed and does not read; every call is refused "
                               "until its administrator fixes it.")
        if not self.keys:
            return self._open
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("This API needs a key: send the header 'Authorization: Bearer KEY'.")
        digest = _digest(token.strip())
        match = None
        for key in self.keys:  # every key compared, in constant time, so timing says nothing
            if hmac.compare_digest(key.digest, digest):
                match = key
        if match is None:
            raise Unauthorized("The API key is not valid.")
        return match

    def admit(self, key: ApiKey, job_id: str) -> None:
        """Count a new job against the key's limits, or raise LimitExceeded (nothing counted)."""
        now = self._clock()
        with self._lock:
            usage = self._usage.setdefault(key.name, _Usage())
            while usage.submitted and now - usage.submitted[0] >= 3600:
                usage.submitted.popleft()
            if len(usage.unfinished) >= key.concurrency:
                raise LimitExceeded(
                    f"Key {key.name!r} has {len(usage.unfinished)} unfinished jobs; its limit is {key.concurrency} "
                    "at once. Wait for one to finish or cancel one.", retry_after_s=5)
            if len(usage.submitted) >= key.per_hour:
                wait = int(3600 - (now - usage.submitted[0])) + 1
                raise LimitExceeded(
                    f"Key {key.name!r} submitted {len(usage.submitted)} jobs in the last hour; its quota is "
                    f"{key.per_hour} per hour. Try again in {wait} s.", retry_after_s=wait)
            usage.unfinished.add(job_id)
            usage.submitted.append(now)

    def release(self, key: ApiKey, job_id: str) -> None:
        """The job ended (or was never queued): it no longer counts against concurrency."""
        with self._lock:
            usage = self._usage.get(key.name)
            if usage is not None:
                usage.unfinished.discard(job_id)

    def unsubmit(self, key: ApiKey, job_id: str) -> None:
        """The engine refused the job: it counts against nothing."""
        with self._lock:
            usage = self._usage.get(key.name)
            if usage is not None:
                usage.unfinished.discard(job_id)
                if usage.submitted:
                    usage.submitted.pop()
