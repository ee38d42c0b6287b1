"""Where a dataset lives: a local directory, or a prefix in any TensorStore kvstore (``s3://``,
``gs://``, ``memory://``, or a kvstore spec dict with an endpoint, region and credentials taken
from the environment as TensorStore does; an ``s3`` endpoint also from ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, which TensorStore ignores; a ``gcs`` one only from
``TENSORSTORE_GCS_HTTP_URL``, which TensorStore reads when it opens a kvstore).
``docs/guides/object-stores.md``.

Local directories commit by renaming; object stores have no rename, so there a dataset commits
by writing its metadata object last (one PUT, atomic on S3 and GCS), naming the prefix that
holds its arrays (`DATA_PREFIX`).
"""

from __future__ import annotations

import functools
import os
import random
import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorstore as ts

from psdp.sources.stores import errors
from psdp.sources.stores.errors import WRITE_ATTEMPTS, backoff_s, is_transient_status

#: The start of the prefix (below the dataset) that one write of a remote dataset fills.
DATA_PREFIX = "psdp-data-"
#: The folder beside a document store that holds the indexes built for it once (``psdp index``;
#: ``psdp.sources.documents.beside``): psdp's own, kept when the store is overwritten (an index
#: of the old store is then refused as stale, naming the command that rebuilds it).
INDEX_DIRECTORY = "psdp-index"
#: The environment variables an ``s3`` spec that names no endpoint takes one from, the first set
#: winning, as the AWS CLI and SDKs read them.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
#: The environment variable TensorStore's gcs driver takes its endpoint from (a gcs spec names
#: none); unset: Google Cloud Storage itself.
GCS_ENDPOINT_VARIABLE = "TENSORSTORE_GCS_HTTP_URL"
#: TensorStore's request retries of the first request to an object store (its reach), when the
#: spec names none: about 5 s of tries in all, so that a store that cannot be reached fails in
#: seconds, naming its endpoint, instead of after TensorStore's own budget for every request (32
#: tries up to 32 s apart: many minutes).
REACH_RETRIES = {"max_retries": 5, "initial_delay": "200ms", "max_delay": "2s"}
#: The most seconds that first request waits for an answer, its tries included (a spec's own
#: request retries too): TensorStore sets no deadline on a request that gets none (a hung
#: server, packets dropped after the handshake), so without it an open waits for good.
REACH_TIMEOUT_S = 30.0
#: A request that moves fewer than 256 bytes in 60 s fails (and is tried again) instead of
#: waiting for good: TensorStore's curl transport sets no such limit unless these are set, as JAX
#: sets them on TPU VMs (the same values). psdp sets each that is unset when this module is
#: imported (with psdp's first store, before its first request); the environment's own are kept.
STALL_LIMITS = {
    "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "256",
}
for _name, _value in STALL_LIMITS.items():
    os.environ.setdefault(_name, _value)
_RETRIES_RESOURCE = {"s3": "s3_request_retries", "gcs": "gcs_request_retries"}
#: Where each object store's credentials come from, for messages.
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default login`",
}
#: The URL scheme of a kvstore driver, where it is not the driver's name.
_SCHEMES = {"gcs": "gs"}


@dataclass(frozen=True)
class Location:
    """A dataset's place: ``local`` (a directory) or ``kvstore`` (a TensorStore kvstore spec
    whose ``path`` is empty or ends in ``/``); ``name`` says which, for messages.

    Examples:
        >>> locate("s3://bucket/corpus").kvstore
        {'bucket': 'bucket', 'driver': 's3', 'path': 'corpus/'}
        >>> locate("file:///data/corpus").local
        PosixPath('/data/corpus')
    """

    local: Path | None
    kvstore: dict[str, Any] | None
    name: str

    def named(self, key: str) -> str:
        """The name of the object ``key`` below this place, for messages: its URL, then the
        endpoint (``s3://b/x/psdp.json (endpoint ...)``), or its path.

        Examples:
            >>> locate({"driver": "s3", "bucket": "corpora", "path": "x/",
            ...         "endpoint": "http://127.0.0.1:9"}).named("psdp.json")
            's3://corpora/x/psdp.json (endpoint http://127.0.0.1:9)'
        """
        if self.kvstore is None:
            return str(Path(self.name) / key)
        return describe_kvstore({**self.kvstore, "path": self.kvstore.get("path", "") + key})

    def below(self, relative: str) -> dict[str, Any]:
        """The kvstore spec to open the prefix ``relative`` (``""`` or ending in ``/``) below
        this one with, its credentials named (`environment_credentials`)."""
        assert self.kvstore is not None
        path = self.kvstore.get("path", "") + relative
        return environment_credentials({**self.kvstore, "path": path})


def is_kvstore_spec(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` is a TensorStore kvstore spec (``{"driver": "s3", ...}``), not an array's
    (``{"driver": "zarr3", "kvstore": ...}``).

    Examples:
        >>> is_kvstore_spec({"driver": "memory"}), is_kvstore_spec({"driver": "zarr3"})
        (True, False)
    """
    try:
        ts.KvStore.Spec(dict(spec))
    except ValueError:
        return False
    return True


def locate(where: str | os.PathLike[str] | Mapping[str, Any]) -> Location:
    """The `Location` of a path, a URL (``file://`` is a local directory) or a kvstore spec."""
    if isinstance(where, os.PathLike) or (isinstance(where, str) and "://" not in where):
        return Location(Path(where), None, str(where))
    if isinstance(where, str) and where.startswith("file://"):
        local = Path(where.removeprefix("file://"))
        return Location(local, None, str(local))
    if isinstance(where, str | Mapping):
        try:
            spec = ts.KvStore.Spec(where if isinstance(where, str) else dict(where)).to_json()
        except (ValueError, NotImplementedError) as error:
            raise ValueError(
                f"{where!r} is not a TensorStore kvstore URL or spec: {error}; give a local "
                "path, a URL such as 's3://bucket/corpus' or 'gs://bucket/corpus', or a kvstore "
                "spec such as {'driver': 's3', 'bucket': 'b', 'path': 'corpus/', 'endpoint': ...}"
            ) from None
        path = spec.get("path", "")
        spec["path"] = path if not path or path.endswith("/") else path + "/"
        spec = environment_endpoint(spec)
        return Location(None, spec, describe_kvstore(spec))
    raise TypeError(
        "a dataset location must be a path, a kvstore URL (s3://, gs://, file://) or a "
        f"TensorStore kvstore spec dict, got {type(where).__name__}"
    )


def environment_credentials(kvstore: Any, environ: Mapping[str, str] = os.environ) -> Any:
    """An ``s3`` kvstore spec (a dict or a URL) completed from the environment: its endpoint
    (`environment_endpoint`), and when it names no credentials, TensorStore's environment provider
    named when ``AWS_ACCESS_KEY_ID`` is set: the provider its default chain picks first then, but
    without the chain's look for ``~/.aws`` files, which logs an ERROR line per missing file on
    every open. Any other spec comes back as it is.

    Examples:
        >>> keys = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}
        >>> spec = environment_credentials({"driver": "s3", "bucket": "corpus"}, keys)
        >>> spec.get("aws_credentials", {"type": "environment"})  # TensorStore 0.1.68: implied
        {'type': 'environment'}
        >>> environment_credentials({"driver": "s3", "bucket": "corpus"}, {})
        {'driver': 's3', 'bucket': 'corpus'}
    """
    if isinstance(kvstore, str) and kvstore.startswith("s3://"):
        kvstore = ts.KvStore.Spec(kvstore).to_json()
    kvstore = environment_endpoint(kvstore, environ)
    if (
        isinstance(kvstore, Mapping)
        and kvstore.get("driver") == "s3"
        and "aws_credentials" not in kvstore
        and environ.get("AWS_ACCESS_KEY_ID")
        and _names_credential_types()
    ):
        return {**kvstore, "aws_credentials": {"type": "environment"}}
    return kvstore


def environment_endpoint(kvstore: Any, environ: Mapping[str, str] = os.environ) -> Any:
    """An ``s3`` kvstore spec dict that names no endpoint, with the one the environment names
    (`ENDPOINT_VARIABLES`; TensorStore reads neither); any other spec comes back as it is, a
    ``gcs`` one once the endpoint TensorStore will read for it (`GCS_ENDPOINT_VARIABLE`), if
    set, is checked to be a URL.

    Examples:
        >>> env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
        >>> environment_endpoint({"driver": "s3", "bucket": "b"}, env)["endpoint"]
        'http://127.0.0.1:9000'
        >>> environment_endpoint({"driver": "s3", "bucket": "b", "endpoint": "http://minio"}, env)
        {'driver': 's3', 'bucket': 'b', 'endpoint': 'http://minio'}
    """
    if isinstance(kvstore, Mapping) and kvstore.get("driver") == "gcs":
        gcs_endpoint(environ)
        return kvstore
    if not isinstance(kvstore, Mapping) or kvstore.get("driver") != "s3" or "endpoint" in kvstore:
        return kvstore
    for variable in ENDPOINT_VARIABLES:
        if environ.get(variable):
            return {**kvstore, "endpoint": checked_endpoint(environ[variable], variable)}
    return kvstore


def gcs_endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """The endpoint TensorStore's gcs driver sends its requests to (`GCS_ENDPOINT_VARIABLE`, checked
    to be an http(s) URL), or ``None``: Google Cloud Storage itself.

    Examples:
        >>> gcs_endpoint({"TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:4443"})
        'http://127.0.0.1:4443'
        >>> gcs_endpoint({}) is None
        True
    """
    endpoint = environ.get(GCS_ENDPOINT_VARIABLE)
    return checked_endpoint(endpoint, GCS_ENDPOINT_VARIABLE, "GCS") if endpoint else None


def with_endpoint(where: Any, endpoint: str | None, option: str = "endpoint") -> Any:
    """``where`` (a path, URL or kvstore spec) with the object store ``endpoint``: an ``s3://``
    URL becomes a spec naming it, an ``s3`` spec gets it unless it names its own; ``None``:
    ``where`` as it is. A ``gs://`` URL or ``gcs`` spec comes back as it is, but since TensorStore
    takes a GCS endpoint only from the environment, this sets `GCS_ENDPOINT_VARIABLE` to
    ``endpoint`` for this process (and the processes it starts): the option wins, as for S3.

    Examples:
        >>> with_endpoint("s3://raw/shards/*.jsonl", "http://127.0.0.1:9000")["path"]
        'shards/*.jsonl'
        >>> with_endpoint("s3://raw/shards/*.jsonl", "http://127.0.0.1:9000")["endpoint"]
        'http://127.0.0.1:9000'
        >>> with_endpoint("data/corpus", "http://127.0.0.1:9000")
        'data/corpus'
    """
    if endpoint is None:
        return where
    if (isinstance(where, str) and where.startswith("gs://")) or (
        isinstance(where, Mapping) and where.get("driver") == "gcs"
    ):
        os.environ[GCS_ENDPOINT_VARIABLE] = checked_endpoint(endpoint, option, "GCS")
        return where
    endpoint = checked_endpoint(endpoint, option)
    if isinstance(where, str) and where.startswith("s3://"):
        where = ts.KvStore.Spec(where).to_json()
    if isinstance(where, Mapping) and where.get("driver") == "s3":
        return where if "endpoint" in where else {**where, "endpoint": endpoint}
    return where


def checked_endpoint(endpoint: str, where: str, kind: str = "S3") -> str:
    """``endpoint`` if it is an http(s) URL with a host; else a `ValueError` naming ``where`` it
    came from (an option or an environment variable) and the ``kind`` of store."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        example = "https://s3.example.com" if kind == "S3" else "https://storage.googleapis.com"
        raise ValueError(
            f"{where}={_redacted(endpoint)!r} is not {'an' if kind == 'S3' else 'a'} {kind} "
            "endpoint URL; give the scheme and "
            f"host, e.g. http://127.0.0.1:9000 or {example}"
        )
    return endpoint


@functools.cache
def _names_credential_types() -> bool:
    """Whether this TensorStore takes ``aws_credentials: {"type": ...}`` (0.1.68 does not, and
    reads the environment first, quietly)."""
    try:
        ts.KvStore.Spec(
            {"driver": "s3", "bucket": "psdp", "aws_credentials": {"type": "environment"}}
        )
    except ValueError:
        return False
    return True


def describe_kvstore(spec: Mapping[str, Any]) -> str:
    """A URL-like name of a kvstore spec, for messages, with the endpoint it reaches (a ``gcs``
    spec's from the environment), any password in it hidden.

    Examples:
        >>> describe_kvstore({"driver": "s3", "bucket": "b", "path": "x/",
        ...                   "endpoint": "http://127.0.0.1:9000"})
        's3://b/x/ (endpoint http://127.0.0.1:9000)'
        >>> describe_kvstore({"driver": "s3", "bucket": "b", "endpoint": "https://me:pw@minio:9000"})
        's3://b/ (endpoint https://me:***@minio:9000)'
        >>> describe_kvstore({"driver": "gcs", "bucket": "corpora", "path": "web/"})
        'gs://corpora/web/'
    """
    bucket = spec.get("bucket")
    driver = str(spec.get("driver"))
    name = (
        f"{_SCHEMES.get(driver, driver)}://{bucket + '/' if bucket else ''}{spec.get('path', '')}"
    )
    endpoint = spec.get("endpoint")
    if driver == "gcs":
        endpoint = os.environ.get(GCS_ENDPOINT_VARIABLE)
    return f"{name} (endpoint {_redacted(endpoint)})" if endpoint else name


def _redacted(url: str) -> str:
    """``url`` without a password it may hold (``http://user:secret@host``), for messages."""
    parts = urllib.parse.urlsplit(str(url))
    if parts.password is None:
        return str(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*):[^@/\s'\"]*@", re.I)


def redacted_message(text: str) -> str:
    """``text`` (an error message) with the password of every URL in it hidden, as `_redacted`.

    Examples:
        >>> redacted_message("Could not connect to http://me:pw@10.0.0.1:9000/b/psdp.json")
        'Could not connect to http://me:***@10.0.0.1:9000/b/psdp.json'
    """
    return _USERINFO.sub(r"\1:***@", text)


def open_kvstore(location: Location, context: ts.Context | None = None) -> ts.KvStore:
    """The kvstore of a remote ``location``, once it answers (`check_reach`); raises naming it
    if it cannot be opened or reached."""
    assert location.kvstore is not None
    spec = location.below("")
    try:
        store = ts.KvStore.open(spec, context=context).result()
    except ValueError as error:
        raise ValueError(
            f"cannot open {location.name}: {redacted_message(str(error))}; check the URL or spec, the credentials in "
            "the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...) and the "
            "endpoint"
        ) from error
    check_reach(spec, location.name, context)
    return store


def check_reach(spec: Mapping[str, Any], name: str, context: ts.Context | None = None) -> None:
    """One request to the object store of the kvstore ``spec`` (a read of ``psdp.json``) with
    `REACH_RETRIES` unless the spec names its own; a `ValueError` naming the store and its
    endpoint if it fails for want of an answer (refused, unresolved, timed out, 5xx), a
    `PermissionError` if the store refuses the credentials (401, 403: never retried). Any other
    outcome (a missing object, or bucket: S3 and GCS answer a read there alike) is left to the
    requests that follow. Nothing for a kvstore with
    no network (``file``, ``memory``)."""
    resource = _RETRIES_RESOURCE.get(str(spec.get("driver")))
    if resource is None:
        return
    probe = spec if resource in spec else {**spec, resource: REACH_RETRIES}
    started = time.monotonic()
    gcs = spec.get("driver") == "gcs"
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            read = ts.KvStore.open(probe, context=context).result().read(b"psdp.json")
            read.result(timeout=max(0.0, started + REACH_TIMEOUT_S - time.monotonic()))
            return
        except TimeoutError:
            read.cancel()
            message = f"no answer within {REACH_TIMEOUT_S} s, its tries included"
            break
        except ValueError as error:
            message = redacted_message(str(error))
        if message.split(":", 1)[0] in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            raise PermissionError(
                f"{name} refused the credentials of this process: {message}. Check the "
                f"credentials in the environment ({_CREDENTIALS['gcs' if gcs else 's3']}) and "
                "that they grant access to this bucket (reading; writing, to write)"
            ) from None
        if not is_transient_status(message):
            return
        if not message.startswith("UNKNOWN") or attempt == WRITE_ATTEMPTS:
            break  # TensorStore's own retries are spent, or psdp's
        # a reply cut off mid-way, which TensorStore does not retry: tried again as a read is
        time.sleep(backoff_s(attempt, errors.WRITE_BACKOFF_S, random.uniform(0.5, 1.0)))
    named = gcs_endpoint() if gcs else spec.get("endpoint")
    itself = "Google Cloud Storage" if gcs else "AWS S3"
    endpoint = "" if named else f" (no endpoint is set: this is {itself} itself)"
    where = (
        f"the environment ({GCS_ENDPOINT_VARIABLE})"
        if gcs
        else "a kvstore spec's \"endpoint\", the environment "
        f"({' or '.join(ENDPOINT_VARIABLES)})"
    )
    raise ValueError(
        f"cannot reach {name}{endpoint}: {message} (gave up after "
        f"{time.monotonic() - started:.1f} s). Check that the endpoint is up and reachable "
        f"from here, or name another: the psdp command's --endpoint URL, or {where}"
    ) from None


def write_not_found(location: Location, other_cause: str = "") -> FileNotFoundError:
    """The error for a write to ``location`` answered 404 Not Found: S3 and GCS answer so where
    the bucket is missing (GCS lists and reads there as in an empty bucket, so a write is where
    it tells); ``other_cause``, where there is one, is named beside it.

    Examples:
        >>> print(write_not_found(locate("s3://corpora/web")))
        cannot write s3://corpora/web/: the store answered a write with 404 Not Found: the bucket 'corpora' does not exist. Create it, or check the URL or spec (the bucket is the first part of the URL)
    """
    bucket = (location.kvstore or {}).get("bucket")
    return FileNotFoundError(
        f"cannot write {location.name}: the store answered a write with 404 Not Found: the "
        f"bucket {bucket!r} does not exist{other_cause}. Create it, or check the URL or spec "
        "(the bucket is the first part of the URL)"
    )


def list_keys(store: ts.KvStore, prefix: str = "") -> list[str]:
    """The keys below ``prefix`` of ``store`` (one paginated LIST), as strings; a
    `FileNotFoundError` naming the store if its bucket does not exist (S3 and GCS answer a read
    there as if the object were missing: the LIST is where they tell, with a 404)."""
    if prefix:
        keys = store.list(ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)))
    else:
        keys = store.list()
    try:
        return sorted(key.decode() for key in keys.result())
    except ValueError as error:
        # TensorStore >= 0.1.82 passes S3's NoSuchBucket on; 0.1.81 parses the 404's body as a
        # listing and reports it malformed (a LIST in a bucket that exists is never a 404)
        if "NoSuchBucket" in str(error):
            why = "does not exist"
        elif "missing <ListBucketResult>" in str(error):
            why = "does not exist, or its endpoint is not an S3 server"
        elif str(error).startswith("NOT_FOUND:"):  # GCS: a LIST in a bucket is never a 404
            why = "does not exist"
        else:
            raise
        name = describe_kvstore(store.spec().to_json())
        raise FileNotFoundError(
            f"the bucket of {name} {why} ({redacted_message(str(error))}). Create it, "
            "or check the URL or spec (the bucket is the first part of the URL)"
        ) from None
