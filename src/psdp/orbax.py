"""The loader's state as an item of an Orbax checkpoint: `LoaderSave` and `LoaderRestore`, the
checkpoint args of `LoaderCheckpointHandler` (``docs/guides/checkpoint-and-resume.md``, "With
Orbax").

The state is one more item of the step the model is saved in, so Orbax's commit of the step
covers both: a step dir is restored only once every item of it is written, and a pod killed
between the model's write and the loader's leaves a step Orbax never restores. Every host has
the same state; Orbax's primary host (process 0) writes it, as Orbax's `JsonCheckpointHandler`
writes (the file is that handler's JSON: ``ocp.args.JsonRestore()`` reads it too), and every
host reads it on restore, where the restored loaders check that they agree. Orbax is optional:
this module imports it, and ``import psdp`` never imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psdp._imports import import_optional
from psdp._integration.data_config import DataConfig
from psdp._integration.loader_config import LoaderConfig
from psdp._runtime.loader import DataLoader
from psdp._runtime.state import check_state

ocp: Any = import_optional("orbax.checkpoint", extra="orbax", needed_for="psdp.orbax")

#: configs whose ``restore(state, mesh, **kwargs)`` builds the restored loader
CONFIGS = (LoaderConfig, DataConfig)

__all__ = ["LoaderCheckpointHandler", "LoaderRestore", "LoaderSave"]


class LoaderCheckpointHandler(ocp.JsonCheckpointHandler):
    """Orbax's handler of `LoaderSave` and `LoaderRestore`: the state as Orbax's JSON item.

    Orbax makes it itself for an item given these args (they are registered with it); it saves
    on every host, and writes on the primary host only.
    """

    async def async_save(self, directory: Any, item: Any = None, args: Any = None) -> Any:
        if not isinstance(args, LoaderSave):
            raise TypeError(
                f"LoaderCheckpointHandler saves psdp.orbax.LoaderSave args, got "
                f"{type(args if args is not None else item).__name__}; pass "
                "args=ocp.args.Composite(..., data=LoaderSave(iterator))"
            )
        return await super().async_save(directory, args=ocp.args.JsonSave(args.state))

    def restore(self, directory: Any, item: Any = None, args: Any = None) -> Any:
        state = super().restore(directory)
        return args.restore(state) if isinstance(args, LoaderRestore) else state


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
class LoaderSave(ocp.args.CheckpointArgs):
    """Saves the loader's state as an item of an Orbax checkpoint.

    The state is taken when the args are made, so make them in the ``manager.save`` call of
    the step whose model they go with.

    Args:
        loader: the iterator the trainer takes batches from (its ``state()``), a `DataLoader`
            (its ``state()``), or a state dict saved before.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh
        >>> mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
        >>> with DataLoader(np.arange(64, dtype=np.int32), mesh=mesh, global_batch_size=8) as loader:
        ...     it = iter(loader)
        ...     _ = next(it)
        ...     LoaderSave(it).state["step"]
        1
    """

    def __init__(self, loader: Any):
        self.state: dict[str, Any] = _state_of(loader)

    def __repr__(self) -> str:
        return f"LoaderSave(step {self.state['step']})"


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
class LoaderRestore(ocp.args.CheckpointArgs):
    """Restores the loader saved by `LoaderSave`: the restored item is a `DataLoader` whose
    ``iter(loader)`` continues at the saved step.

    The mesh (so the host count), the batch size, skips and ``drop_last`` may differ from the
    saved run's: `DataLoader.restore`'s rules (``docs/reference/reliability.md``).

    Args:
        source: the source to read (as `DataLoader` takes it), or a `LoaderConfig` or
            `DataConfig` (then ``config.restore(state, mesh, **kwargs)``, e.g. with
            ``batch_axes=``); ``None`` with no mesh: the restored item is the state dict itself.
        mesh: the mesh of the restored loader.
        **kwargs: other `DataLoader.restore` arguments (``global_batch_size``, ``batch_spec``,
            ...), or the config's ``restore`` arguments (``batch_axes``, ...).
    """

    def __init__(self, source: Any = None, /, *, mesh: Any = None, **kwargs: Any):
        if (source is None) != (mesh is None) and not isinstance(source, CONFIGS):
            raise TypeError(
                "LoaderRestore needs the source and the mesh, e.g. LoaderRestore(source, "
                f"mesh=mesh), or neither (the state dict itself); got source="
                f"{type(source).__name__} and mesh={type(mesh).__name__}"
            )
        if isinstance(source, CONFIGS) and mesh is None:
            raise TypeError(
                f"LoaderRestore(config, mesh=mesh): a {type(source).__name__} needs the mesh"
            )
        self.source, self.mesh, self.kwargs = source, mesh, kwargs

    def restore(self, state: Mapping[str, Any]) -> Any:
        """The restored item: a `DataLoader` at ``state``'s step, or ``state`` itself."""
        if self.source is None:
            return dict(state)
        if isinstance(self.source, CONFIGS):
            return self.source.restore(state, self.mesh, **self.kwargs)
        return DataLoader.restore(state, self.source, mesh=self.mesh, **self.kwargs)

    def __repr__(self) -> str:
        what = "the state" if self.source is None else type(self.source).__name__
        return f"LoaderRestore({what})"


def _state_of(loader: Any) -> dict[str, Any]:
    if isinstance(loader, Mapping):
        return check_state(loader)
    state = getattr(loader, "state", None)
    if not callable(state):
        raise TypeError(
            f"LoaderSave takes the iterator the trainer reads (it = iter(loader)), a DataLoader, "
            f"or a saved state dict, got {type(loader).__name__}; pass LoaderSave(it)"
        )
    return check_state(state())
