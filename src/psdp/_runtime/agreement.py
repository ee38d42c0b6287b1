"""Agreement across the processes of a mesh: the settings batches depend on (`agree`), a failure
to build a loader on some of them (`failures_published`), and the step where a callable stream's
shards end (`StreamEnds`), through the coordination service's key-value store, not device
collectives. Why and how: ``docs/concepts/loader.md``, "Hosts that must agree", and ``docs/guides/streams.md``,
"Shards of unequal length".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from psdp._compat import coordination_client
from psdp._plan.layout import MeshLayout

logger = logging.getLogger(__name__)

#: Seconds a host waits for the other processes of its mesh (to build the same loader, or to
#: reach the same stream step) before it raises `TimeoutError` naming the missing ones.
TIMEOUT_S = 300.0

_POLL_S = 0.25  # how often a waiting stream step looks whether its loader was closed

#: The fix to print when one setting differs across hosts; others get `_GENERIC_FIX`.
FIXES = {
    "seed": "pass the same seed on every host, from the config, never from time.time() or the "
    "process index",
    "source rows": "every host must read the same dataset: the processes with the other value "
    "have a stale or partial copy; copy it again, or read one store from every host",
    "source leaves": "every host must read the same dataset: the processes with the other value "
    "have a copy with other leaves, dtypes or shapes; copy it again, or read one store from "
    "every host",
    "step": "restore every host from the same checkpoint (one host writes the loader state, "
    "every host reads that file)",
    "start step": "restore every host from the same checkpoint (one host writes the loader "
    "state, every host reads that file), or pass the same start_at everywhere",
    "start offset": "restore every host from the same checkpoint (one host writes the loader "
    "state, every host reads that file), or pass the same start_at everywhere",
    "saved source": "restore every host from the same checkpoint (one host writes the loader "
    "state, every host reads that file)",
}
_GENERIC_FIX = "build the loader with the same arguments on every process of the mesh"
_CAUSE_CHARS = 1000  # of a failed process's error, published for the others
# Below an agreement round's key: one key per distinct settings' digest, and one per failed
# process (``failed-<process>``, its error), read together once every process arrived.
_OUTCOMES = "outcomes"
_FAILED = "failed-"


class HostFailedError(RuntimeError):
    """Other processes of the mesh failed to build or restore the loader this one built.

    Raised at once on every process that reached the agreement, naming each failed process and
    its error; the failed processes raise their own errors (``docs/concepts/loader.md``, "Hosts that must
    agree").

    Attributes:
        failures: failed process -> what it did and its error, ``"(building DataLoader 'x'):
            Type: message"``.
    """

    def __init__(self, message: str, failures: Mapping[int, str]) -> None:
        super().__init__(message)
        self.failures = dict(failures)


_rounds: dict[str, int] = {}
_rounds_lock = threading.Lock()


# ------------------------------------------------------------------------------ who is this
def check_own_process(layout: MeshLayout, process_index: int | None) -> int:
    """This process's index, checked against the mesh: it must hold devices of it.

    A loader places rows on its own process's devices, so ``process_index`` (when given) must be
    ``jax.process_index()``, and this process must own devices of the mesh.

    Examples:
        >>> import numpy as np
        >>> layout = MeshLayout(np.array([[0, 0]]), ("data", "model"))
        >>> check_own_process(layout, None)
        0
        >>> check_own_process(layout, 2)
        Traceback (most recent call last):
            ...
        ValueError: process_index=2 is not this process: jax.process_index() is 0, and a DataLoader places rows only on its own process's devices (the mesh's devices belong to processes numbered 0..0); leave process_index unset (it defaults to jax.process_index())
    """
    me = jax.process_index()
    if process_index is not None and process_index != me:
        raise ValueError(
            f"process_index={process_index!r} is not this process: jax.process_index() is {me}, "
            f"and a DataLoader places rows only on its own process's devices (the mesh's devices "
            f"belong to processes {layout.describe_processes()}); leave process_index unset (it "
            "defaults to jax.process_index())"
        )
    if me not in layout.processes:
        owners = list(layout.processes)
        raise ValueError(
            f"process {me} holds no device of the mesh, whose devices belong to processes "
            f"{owners[:16]}{' ...' if len(owners) > 16 else ''}; a process can only feed its own "
            f"devices: build this DataLoader only on those processes (e.g. under `if "
            f"jax.process_index() in {tuple(owners[:4])}{'...' if len(owners) > 4 else ''}:`), "
            "or build the mesh over every process"
        )
    return me


# ---------------------------------------------------------------------------- construction
def agree(
    settings: Mapping[str, Any], processes: Sequence[int], what: str, timeout_s: float | None = None
) -> str | None:
    """Checks that every process in ``processes`` called this with equal ``settings``.

    Every process of the mesh must call it, in the same order relative to its other calls for
    the same set of processes (as every host builds the same loaders in the same order). Cost per
    process: three round trips to the coordination service and one barrier, each of a few dozen
    bytes whatever the number of processes (``docs/measurements/scale.md``); the values themselves travel
    only when they differ.

    Args:
        settings: setting name -> a JSON-able value.
        processes: the processes of the mesh (ascending); this process must be one of them.
        what: what the processes did, e.g. ``"built DataLoader 'train'"``.
        timeout_s: how long to wait for the others (default `TIMEOUT_S`).

    Returns:
        A key namespace unique to this agreement (for `StreamEnds`), or ``None`` when there is
        nothing to agree on (one process, or no ``jax.distributed``).

    Raises:
        ValueError: on every process, when the settings differ: names each differing setting,
            which processes have which value, and the fix.
        TimeoutError: some processes did not arrive within ``timeout_s``: names them.

    Examples:
        >>> agree({"seed": 3}, [0], "built a loader") is None  # one process agrees with itself
        True
    """
    client = coordination_client()
    if len(processes) < 2:
        return None
    if client is None:
        _warn_once(
            "psdp cannot check that the %d processes of the mesh build their loaders alike, nor "
            "agree where a callable stream ends: jax.distributed is not initialized (call "
            "jax.distributed.initialize() first)",
            len(processes),
        )
        return None
    timeout = TIMEOUT_S if timeout_s is None else timeout_s
    me = jax.process_index()
    base = f"{_group(processes)}/{_next_round(_group(processes))}"
    text = json.dumps(settings, sort_keys=True, default=repr)
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    client.key_value_set(f"{base}/digest/{me}", digest)  # who arrived: read only on a timeout
    # one key per distinct digest, so that what each process reads back does not grow with the
    # processes: one key when they agree
    client.key_value_set(f"{base}/{_OUTCOMES}/{digest}", "", True)
    _barrier(client, f"{base}/built", processes, base, what, timeout)
    failed, digests = _outcomes(client, base)
    if failed:
        raise HostFailedError(describe_failures(failed, me, what), failed)
    if digests == {digest}:
        return base
    client.key_value_set(f"{base}/settings/{me}", text)
    _barrier(client, f"{base}/told", processes, base, what, timeout)
    values = {
        int(key.rsplit("/", 1)[1]): json.loads(value)
        for key, value in client.key_value_dir_get(f"{base}/settings/")
    }
    raise ValueError(describe_difference(values, what))


@contextlib.contextmanager
def failures_published(processes: Sequence[int], doing: str) -> Iterator[None]:
    """Runs the block; if it raises, tells the other processes of the mesh first, then re-raises.

    The block is what a process does before its `agree` call (checks, the first read, the
    plan): a process that fails there takes part in that agreement all the same, with its error
    instead of its settings, so the others raise `HostFailedError` as soon as every process has
    arrived, instead of waiting `TIMEOUT_S` for it. Nothing is published by a process outside
    ``processes``, or without ``jax.distributed``.

    Examples:
        >>> with failures_published([0], "building a loader"):  # one process: nobody to tell
        ...     pass
    """
    try:
        yield
    except Exception as error:  # not Ctrl-C: an interrupted process leaves at once
        client = coordination_client()
        me = jax.process_index()
        if client is not None and len(processes) > 1 and me in processes:
            _publish(client, processes, me, f"({doing}): {type(error).__name__}: {error}", error)
        raise


def _publish(
    client: Any, processes: Sequence[int], me: int, cause: str, error: BaseException
) -> None:
    """This process's failure, in the agreement round the others wait in; waits for them there,
    so that every process leaves the round together."""
    base = f"{_group(processes)}/{_next_round(_group(processes))}"
    cause = " ".join(cause.split())[:_CAUSE_CHARS]
    client.key_value_set(f"{base}/{_OUTCOMES}/{_FAILED}{me}", cause)
    try:
        _barrier(client, f"{base}/built", processes, base, "failed", TIMEOUT_S)
    except TimeoutError as late:  # the others learn nothing more; this error says why it waited
        error.add_note(f"psdp: after this error, {late}")


def describe_failures(failed: Mapping[int, str], me: int, what: str) -> str:
    """The error of a process that reached the agreement while others failed before it.

    Examples:
        >>> failed = {2: "(building DataLoader 'train'): OSError: EIO reading shard 7"}
        >>> print(describe_failures(failed, 0, "built DataLoader 'train'"))
        process 2 of the mesh failed, while process 0 built DataLoader 'train' and waited for it: process 2 (building DataLoader 'train'): OSError: EIO reading shard 7; every process of the mesh must build the loader: fix the error on process 2 (raised there, with its traceback)
    """
    failing = _who(sorted(failed), verb=False)
    causes = "; ".join(f"process {p} {failed[p]}" for p in sorted(failed))
    return (
        f"{failing} of the mesh failed, while process {me} {what} and waited for "
        f"{'it' if len(failed) == 1 else 'them'}: {causes}; every process of the mesh must build "
        f"the loader: fix the error on {failing} (raised there, with its traceback)"
    )


def describe_difference(values: Mapping[int, Mapping[str, Any]], what: str) -> str:
    """The error for settings that differ: each setting, who has which value, and the fix.

    Examples:
        >>> values = {0: {"seed": 1}, 1: {"seed": 2}, 2: {"seed": 1}}
        >>> print(describe_difference(values, "built a loader"))
        the 3 processes of the mesh built a loader with different settings, so devices that must hold the same rows would get different ones. seed (processes 0, 2 have 1, process 1 has 2): pass the same seed on every host, from the config, never from time.time() or the process index
    """
    names = sorted({name for settings in values.values() for name in settings})
    parts = []
    for name in names:
        holders: dict[str, list[int]] = {}
        for process in sorted(values):
            value = json.dumps(values[process].get(name), sort_keys=True)
            holders.setdefault(value, []).append(process)
        if len(holders) > 1:
            who = ", ".join(f"{_who(ps)} {value}" for value, ps in holders.items())
            parts.append(f"{name} ({who}): {FIXES.get(name, _GENERIC_FIX)}")
    return (
        f"the {len(values)} processes of the mesh {what} with different settings, so devices "
        f"that must hold the same rows would get different ones. {'. '.join(parts)}"
    )


# --------------------------------------------------------------------------- stream steps
class StreamEnds:
    """Per step of a stream, the shards that ran short, agreed by every process of the mesh.

    Each process reports its shard and rows for the step, then waits (at most `TIMEOUT_S`) for
    the report of every other process of the mesh. Keys are named by ``run`` (one per iterator,
    or per direct `batch_at` call, numbered alike on every host) and the step. A process that has
    every report of step ``s - 1`` knows that every process finished step ``s - 2``, so it
    deletes its own report of that step: nothing accumulates.
    """

    def __init__(self, namespace: str, processes: Sequence[int], shard: int, describe: str):
        self.namespace = namespace
        self.processes = tuple(processes)
        self.shard = shard
        self.describe = describe

    def short_shards(
        self, run: str, step: int, got: int, wanted: int, stop: Callable[[], bool]
    ) -> dict[int, int]:
        """Shard -> rows, for every shard with fewer than ``wanted`` rows at ``step``.

        ``stop()`` is polled while waiting; when it turns true (the loader or iterator was
        closed) this raises `InterruptedError`.
        """
        client = coordination_client()
        assert client is not None  # StreamEnds exists only where agree() found one
        me = jax.process_index()
        steps = f"{self.namespace}/{run}"
        client.key_value_set(f"{steps}/{step}/{me}", f"{self.shard} {got}", True)
        short: dict[int, int] = {}
        for process in self.processes:
            report = self._wait(client, f"{steps}/{step}", process, step, stop)
            shard, rows = map(int, report.split())
            if rows < wanted:
                short[shard] = rows  # every host of a shard reports the same rows
        client.key_value_delete(f"{steps}/{step - 2}/{me}")
        return short

    def _wait(self, client: Any, at: str, process: int, step: int, stop: Callable[[], bool]) -> str:
        """``process``'s report under ``at``, once it is set; polls ``stop()`` while waiting."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                return str(client.blocking_key_value_get(f"{at}/{process}", int(_POLL_S * 1000)))
            except jax.errors.JaxRuntimeError as error:
                if "DEADLINE_EXCEEDED" not in str(error):
                    raise
            if stop():
                raise InterruptedError(f"step {step}: closed while waiting for the other hosts")
            if time.monotonic() > deadline:
                arrived = {int(key.rsplit("/", 1)[1]) for key, _ in client.key_value_dir_get(at)}
                missing = [p for p in self.processes if p not in arrived]
                raise TimeoutError(
                    f"step {step} of {self.describe}: {_who(missing, verb=False)} of the mesh "
                    f"did not reach it within {TIMEOUT_S:g} s; every process must read the same "
                    "steps in the same order (a peek with batch_at on one host only, or a host "
                    "that stopped iterating, leaves the others waiting)"
                )


def describe_end(
    step: int, ended: Sequence[int], short: Mapping[int, int], num_shards: int, describe: str
) -> str:
    """The `StopIteration` message at a stream's end, saying whether shards were unequal.

    Examples:
        >>> describe_end(4, [1], {1: 0}, 2, "StreamSource(files, sharded by a callable)")
        'step 4: shard 1 of 2 of StreamSource(files, sharded by a callable) ended; the other shards still had elements (the shards of a callable stream have unequal lengths), and every host stops at the first end'
    """
    names = ", ".join(map(str, ended))
    message = f"step {step}: shard {names} of {num_shards} of {describe} ended"
    if len(short) < num_shards or len(set(short.values())) > 1:
        message += (
            "; the other shards still had elements (the shards of a callable stream have "
            "unequal lengths), and every host stops at the first end"
        )
    return message


# -------------------------------------------------------------------------------- helpers
_warned: set[str] = set()


def _warn_once(message: str, *args: Any) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message, *args)


def _group(processes: Sequence[int]) -> str:
    """A short key naming a set of processes (a mesh over some processes has its own rounds),
    of the same length for any number of processes."""
    text = ",".join(map(str, processes))
    return f"psdp/{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def _next_round(group: str) -> int:
    """This process's count of agreements for ``group``: equal on every host that built the same
    loaders in the same order."""
    with _rounds_lock:
        _rounds[group] = _rounds.get(group, 0) + 1
        return _rounds[group]


def _barrier(
    client: Any, name: str, processes: Sequence[int], base: str, what: str, timeout_s: float
) -> None:
    try:
        client.wait_at_barrier(name, int(timeout_s * 1000), _members(processes))
    except jax.errors.JaxRuntimeError as error:
        if "DEADLINE_EXCEEDED" not in str(error):
            raise
        arrived = _arrivals(client, base)
        missing = [p for p in processes if p not in arrived]
        raise TimeoutError(
            f"{_who(missing, verb=False)} of the mesh did not arrive within {timeout_s:g} s, "
            f"while {_who(sorted(arrived), verb=False)} {what} and waited; every process of the "
            f"mesh must build the same loaders in the same order: look for an error, or a loader "
            f"that was not built, on {_who(missing, verb=False)}"
        ) from None


def _members(processes: Sequence[int]) -> list[int] | None:
    """The processes a barrier names: none when they are all of the job's (the service's
    default), so that a barrier's request does not grow with the processes."""
    return None if list(processes) == list(range(jax.process_count())) else list(processes)


def _outcomes(client: Any, base: str) -> tuple[dict[int, str], set[str]]:
    """The failed processes with their errors, and the distinct settings' digests, of the
    agreement round ``base`` (one round trip)."""
    failed, digests = {}, set()
    for key, value in client.key_value_dir_get(f"{base}/{_OUTCOMES}/"):
        name = key.rsplit("/", 1)[1]
        if name.startswith(_FAILED):
            failed[int(name.removeprefix(_FAILED))] = value
        else:
            digests.add(name)
    return failed, digests


def _arrivals(client: Any, base: str) -> set[int]:
    """The processes that arrived in the agreement round ``base``, with their settings or their
    error (one round trip, of every process's key: only when some are late)."""
    arrived = set()
    for key, _ in client.key_value_dir_get(f"{base}/"):
        kind, name = key.rsplit("/", 2)[-2:]
        if kind == "digest":
            arrived.add(int(name))
        elif kind == _OUTCOMES and name.startswith(_FAILED):
            arrived.add(int(name.removeprefix(_FAILED)))
    return arrived


def _who(processes: Sequence[int], verb: bool = True) -> str:
    """``"process 3 has"``, ``"processes 0, 1, 2 have"`` (or without the verb)."""
    if len(processes) == 1:
        return f"process {processes[0]}" + (" has" if verb else "")
    return f"processes {', '.join(map(str, processes))}" + (" have" if verb else "")
