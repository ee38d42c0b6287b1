"""psdp: data loading for partially sharded data parallelism on JAX device meshes.

Every host of a multi-controller JAX job reads exactly the rows its devices hold (`plan_batch`),
hosts that hold the same rows share a data-shard uid (`process_mesh_mapping`), and the loader builds
one global `jax.Array` per batch leaf from host-local reads.
"""

import importlib
from typing import TYPE_CHECKING, Any

from psdp import _deprecated
from psdp._imports import lazy_attributes
from psdp._integration.consistency import ConsistencyError as ConsistencyError
from psdp._integration.consistency import ConsistencyReport as ConsistencyReport
from psdp._integration.consistency import check_consistency as check_consistency
from psdp._integration.data_config import DataConfig as DataConfig
from psdp._integration.filter_shard import filter_shard as filter_shard
from psdp._integration.loader_config import LoaderConfig as LoaderConfig
from psdp._integration.loader_config import MeshConfig as MeshConfig
from psdp._integration.mixture_config import MixtureConfig as MixtureConfig
from psdp._integration.mixture_config import StageConfig as StageConfig
from psdp._integration.source_config import SourceConfig as SourceConfig
from psdp._integration.view_config import ViewConfig as ViewConfig
from psdp._plan.layout import MeshLayout as MeshLayout
from psdp._plan.mesh import DataPlan as DataPlan
from psdp._plan.mesh import PodPlan as PodPlan
from psdp._plan.mesh import RowBlock as RowBlock
from psdp._plan.mesh import local_device_mapping as local_device_mapping
from psdp._plan.mesh import plan_batch as plan_batch
from psdp._plan.mesh import plan_pod as plan_pod
from psdp._plan.mesh import process_mesh_mapping as process_mesh_mapping
from psdp._plan.offsets import StepInfo as StepInfo
from psdp._plan.options import LoaderOptions as LoaderOptions
from psdp._plan.options import OrderOptions as OrderOptions
from psdp._plan.options import OutputOptions as OutputOptions
from psdp._plan.options import ReadingOptions as ReadingOptions
from psdp._plan.options import ShardingOptions as ShardingOptions
from psdp._plan.order import GlobalOrder as GlobalOrder
from psdp._plan.pack_windows import PackIndex as PackIndex
from psdp._plan.packing import PACKING_STRATEGIES as PACKING_STRATEGIES
from psdp._plan.packing import PackPlan as PackPlan
from psdp._plan.packing import plan_packing as plan_packing
from psdp._plan.partition import STRATEGIES as STRATEGIES
from psdp._plan.partition import default_batch_spec as default_batch_spec
from psdp._runtime.agreement import HostFailedError as HostFailedError
from psdp._runtime.evaluation import eval_loader as eval_loader
from psdp._runtime.loader import DataLoader as DataLoader
from psdp._runtime.prefetch import LoaderClosedError as LoaderClosedError
from psdp._runtime.telemetry import LoaderStats as LoaderStats
from psdp.sources import ArraySource as ArraySource
from psdp.sources import DocumentStore as DocumentStore
from psdp.sources import GrainRecords as GrainRecords
from psdp.sources import GrainSource as GrainSource
from psdp.sources import MaxTextRows as MaxTextRows
from psdp.sources import MemmapSource as MemmapSource
from psdp.sources import Mixture as Mixture
from psdp.sources import PackedSequences as PackedSequences
from psdp.sources import Source as Source
from psdp.sources import StagedPacked as StagedPacked
from psdp.sources import StagedTokens as StagedTokens
from psdp.sources import StreamReader as StreamReader
from psdp.sources import StreamSource as StreamSource
from psdp.sources import TokenSequences as TokenSequences

if TYPE_CHECKING:  # imported on first use below: both load tensorstore, which is slow to import
    from psdp.prepare import prepare as prepare
    from psdp.sources import TensorStoreSource as TensorStoreSource
    from psdp.sources.documents.writer import write_documents as write_documents
    from psdp.sources.stores.writer import write_dataset as write_dataset

_lazy_getattr, _lazy_dir = lazy_attributes(
    __name__,
    {
        "psdp.sources": ["TensorStoreSource"],
        "psdp.sources.stores.writer": ["write_dataset"],
        "psdp.sources.documents.writer": ["write_documents"],
    },
    globals(),
)


def __getattr__(name: str) -> Any:
    if name == "prepare":  # the package, callable as its function: one object for both spellings
        return importlib.import_module("psdp.prepare")
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted({*_lazy_dir(), "prepare"})


#: the public names: ``from psdp import *`` gives these and no import helper (``Any``, ...);
#: each has an entry in the API reference (docs/reference/api/, checked by tests/test_docs.py)
__all__ = [
    "PACKING_STRATEGIES",
    "STRATEGIES",
    "ArraySource",
    "ConsistencyError",
    "ConsistencyReport",
    "DataConfig",
    "DataLoader",
    "DataPlan",
    "DocumentStore",
    "GlobalOrder",
    "GrainRecords",
    "GrainSource",
    "HostFailedError",
    "LoaderClosedError",
    "LoaderConfig",
    "LoaderOptions",
    "LoaderStats",
    "MaxTextRows",
    "MemmapSource",
    "MeshConfig",
    "MeshLayout",
    "Mixture",
    "MixtureConfig",
    "OrderOptions",
    "OutputOptions",
    "PackIndex",
    "PackPlan",
    "PackedSequences",
    "PodPlan",
    "ReadingOptions",
    "RowBlock",
    "ShardingOptions",
    "Source",
    "SourceConfig",
    "StageConfig",
    "StagedPacked",
    "StagedTokens",
    "StepInfo",
    "StreamReader",
    "StreamSource",
    "TensorStoreSource",
    "TokenSequences",
    "ViewConfig",
    "check_consistency",
    "default_batch_spec",
    "eval_loader",
    "filter_shard",
    "local_device_mapping",
    "plan_batch",
    "plan_packing",
    "plan_pod",
    "prepare",
    "process_mesh_mapping",
    "write_dataset",
    "write_documents",
]

__version__ = "0.1.0"

_deprecated.install()  # the previous release's module paths (psdp.config, ...), for one release
