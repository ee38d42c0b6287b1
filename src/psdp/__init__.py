"""psdp: data loading for partially sharded data parallelism on JAX device meshes.

Every host of a multi-controller JAX job reads exactly the rows its devices hold (`plan_batch`),
hosts that hold the same rows share a data-shard uid (`process_mesh_mapping`), and the loader builds
one global `jax.Array` per batch leaf from host-local reads.
"""

from typing import TYPE_CHECKING

from psdp._imports import lazy_attributes
from psdp.config import LoaderConfig as LoaderConfig
from psdp.config import MeshConfig as MeshConfig
from psdp.consistency import ConsistencyError as ConsistencyError
from psdp.consistency import ConsistencyReport as ConsistencyReport
from psdp.consistency import check_consistency as check_consistency
from psdp.layout import MeshLayout as MeshLayout
from psdp.loader import DataLoader as DataLoader
from psdp.mesh import DataPlan as DataPlan
from psdp.mesh import PodPlan as PodPlan
from psdp.mesh import RowBlock as RowBlock
from psdp.mesh import local_device_mapping as local_device_mapping
from psdp.mesh import plan_batch as plan_batch
from psdp.mesh import plan_pod as plan_pod
from psdp.mesh import process_mesh_mapping as process_mesh_mapping
from psdp.order import GlobalOrder as GlobalOrder
from psdp.partition import STRATEGIES as STRATEGIES
from psdp.partition import default_batch_spec as default_batch_spec
from psdp.prefetch import LoaderClosedError as LoaderClosedError
from psdp.sharding import filter_shard as filter_shard
from psdp.sources import ArraySource as ArraySource
from psdp.sources import GrainSource as GrainSource
from psdp.sources import MemmapSource as MemmapSource
from psdp.sources import Source as Source
from psdp.sources import StreamReader as StreamReader
from psdp.sources import StreamSource as StreamSource
from psdp.telemetry import LoaderStats as LoaderStats

if TYPE_CHECKING:  # imported on first use below: both load tensorstore, which is slow to import
    from psdp.sources import TensorStoreSource as TensorStoreSource
    from psdp.writer import write_dataset as write_dataset

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {"psdp.sources": ["TensorStoreSource"], "psdp.writer": ["write_dataset"]},
    globals(),
)

__version__ = "0.1.0"
