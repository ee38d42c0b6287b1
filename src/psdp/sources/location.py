"""Where a dataset lives: a local directory, or a prefix in any TensorStore kvstore (``s3://``,
``gs://``, ``memory://``, or a kvstore spec dict with an endpoint, region and credentials taken
from the environment as TensorStore does). ``docs/sources.md``, "Remote stores".

Local directories commit by renaming; object stores have no rename, so there a dataset commits
by writing its metadata object last (one PUT, atomic on S3 and GCS), naming the prefix that
holds its arrays (`DATA_PREFIX`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorstore as ts

#: The start of the prefix (below the dataset) that one write of a remote dataset fills.
DATA_PREFIX = "psdp-data-"


@dataclass(frozen=True)
class Location:
    """A dataset's place: ``local`` (a directory) or ``kvstore`` (a TensorStore kvstore spec
    whose ``path`` is empty or ends in ``/``); ``name`` says which, for messages.

    Example:
        >>> locate("s3://bucket/corpus").kvstore
        {'bucket': 'bucket', 'driver': 's3', 'path': 'corpus/'}
        >>> locate("file:///data/corpus").local
        PosixPath('/data/corpus')
    """

    local: Path | None
    kvstore: dict[str, Any] | None
    name: str

    def below(self, relative: str) -> dict[str, Any]:
        """The kvstore spec to open the prefix ``relative`` (``""`` or ending in ``/``) below
        this one with, its credentials named (`environment_credentials`)."""
        assert self.kvstore is not None
        path = self.kvstore.get("path", "") + relative
        return environment_credentials({**self.kvstore, "path": path})


def is_kvstore_spec(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` is a TensorStore kvstore spec (``{"driver": "s3", ...}``), not an array's
    (``{"driver": "zarr3", "kvstore": ...}``).

    Example:
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
        return Location(None, spec, describe_kvstore(spec))
    raise TypeError(
        "a dataset location must be a path, a kvstore URL (s3://, gs://, file://) or a "
        f"TensorStore kvstore spec dict, got {type(where).__name__}"
    )


def environment_credentials(kvstore: Any, environ: Mapping[str, str] = os.environ) -> Any:
    """An ``s3`` kvstore spec (a dict or a URL) that names no credentials, with TensorStore's
    environment provider named when ``AWS_ACCESS_KEY_ID`` is set: the provider its default chain
    picks first then, but without the chain's look for ``~/.aws`` files, which logs an ERROR line
    per missing file on every open. Any other spec comes back as it is.

    Example:
        >>> keys = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}
        >>> spec = environment_credentials({"driver": "s3", "bucket": "corpus"}, keys)
        >>> spec.get("aws_credentials", {"type": "environment"})  # TensorStore 0.1.68: implied
        {'type': 'environment'}
        >>> environment_credentials({"driver": "s3", "bucket": "corpus"}, {})
        {'driver': 's3', 'bucket': 'corpus'}
    """
    if isinstance(kvstore, str) and kvstore.startswith("s3://"):
        kvstore = ts.KvStore.Spec(kvstore).to_json()
    if (
        isinstance(kvstore, Mapping)
        and kvstore.get("driver") == "s3"
        and "aws_credentials" not in kvstore
        and environ.get("AWS_ACCESS_KEY_ID")
        and _names_credential_types()
    ):
        return {**kvstore, "aws_credentials": {"type": "environment"}}
    return kvstore


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
    """A URL-like name of a kvstore spec, for messages.

    Example:
        >>> describe_kvstore({"driver": "s3", "bucket": "b", "path": "x/",
        ...                   "endpoint": "http://127.0.0.1:9000"})
        's3://b/x/ (endpoint http://127.0.0.1:9000)'
    """
    bucket = spec.get("bucket")
    name = f"{spec.get('driver')}://{bucket + '/' if bucket else ''}{spec.get('path', '')}"
    endpoint = spec.get("endpoint")
    return f"{name} (endpoint {endpoint})" if endpoint else name


def open_kvstore(location: Location, context: ts.Context | None = None) -> ts.KvStore:
    """The kvstore of a remote ``location``; raises naming it if it cannot be opened."""
    assert location.kvstore is not None
    try:
        return ts.KvStore.open(location.below(""), context=context).result()
    except ValueError as error:
        raise ValueError(
            f"cannot open {location.name}: {error}; check the URL or spec, the credentials in "
            "the environment (AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS, ...) and the "
            "endpoint"
        ) from error


def list_keys(store: ts.KvStore, prefix: str = "") -> list[str]:
    """The keys below ``prefix`` of ``store`` (one paginated LIST), as strings."""
    if prefix:
        keys = store.list(ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)))
    else:
        keys = store.list()
    return sorted(key.decode() for key in keys.result())
