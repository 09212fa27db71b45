"""Event classes: GPU kernels (compute / communication / memory), host collectives, the engines' labels.

The GPU classes follow HolisticTraceAnalysis (hta/common/types.py): a kernel is communication when its name
is an NCCL/RCCL/HCCL collective, memory when it is a memcpy/memset (or its category says so), compute
otherwise. HTA's communication pattern is `^nccl`; we also accept the names NCCL kernels carry inside a
longer name (`...ncclKernel_...`, `...ncclDevKernel_...`) and RCCL/HCCL prefixes, so a renamed or
decorated collective kernel is still communication.
"""

from __future__ import annotations

import re
from typing import Protocol

import numpy as np


class Trace(Protocol):
    """What the masks below read of a loaded trace (bench.analyze.trace.Trace is one): per event, an index
    into the trace's tables of distinct names and categories. A protocol, not an import: trace.py uses this
    module's vocabulary, so importing it here would make the two a cycle."""

    names: np.ndarray     # object: the distinct event names
    cats: np.ndarray      # object: the distinct categories, lower-cased
    name_id: np.ndarray
    cat_id: np.ndarray

    def __len__(self) -> int: ...


# --- GPU side -------------------------------------------------------------------------------------------
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset", "memcpy", "memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "hip_runtime", "hip_driver"})
COMM_KERNEL = re.compile(r"^(nccl|rccl|hccl)|nccl(Dev)?Kernel", re.IGNORECASE)
MEMORY_KERNEL = re.compile(r"^(hip)?(Memcpy|Memset)|^dma")
ALLREDUCE_KERNEL = re.compile(r"all_?reduce", re.IGNORECASE)
# FSDP's collectives (NCCL kernels: ncclDevKernel_AllGather_RING_LL, ncclDevKernel_ReduceScatter_...)
ALLGATHER_KERNEL = re.compile(r"all_?gather", re.IGNORECASE)
REDUCE_SCATTER_KERNEL = re.compile(r"reduce_?scatter", re.IGNORECASE)

# CUPTI's synchronisation records (`Stream Sync`, `Event Sync`, `Context Sync`). HTA counts those drawn on
# a stream (tid = the stream, not -1) among the GPU events of its breakdown, in neither compute, nor
# communication, nor memory (its OTHER kind), so they add to busy time and to non-compute time.
SYNC_CAT = "cuda_sync"
# HTA's is_compute_kernel (hta/utils/utils.py NCCL_COMPUTE_KERNEL_RE): a name containing Memcpy or Sync
# is not computation even when it is not a memory kernel; HTA's kind for it is OTHER.
NOT_COMPUTE = re.compile(r".*Memcpy|.*Sync")

COMPUTE, COMM, MEMORY, OTHER = 0, 1, 2, 3


def gpu_class(name: str, cat: str) -> int:
    """COMPUTE, COMM, MEMORY or OTHER for one GPU event (HTA's get_kernel_type, plus decorated NCCL names
    as communication)."""
    if cat in MEMORY_CATS or MEMORY_KERNEL.match(name):
        return MEMORY
    if COMM_KERNEL.search(name):
        return COMM
    if cat == SYNC_CAT or NOT_COMPUTE.match(name):
        return OTHER
    return COMPUTE


# --- host side ------------------------------------------------------------------------------------------
HOST_OP_CATS = frozenset({"cpu_op", "operator"})
ANNOTATION_CAT = "user_annotation"
PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
# A collective as the process group records it: on the host thread that issues it (nccl:*), or on the
# background thread that runs it (gloo:*). torch names them "<backend>:<collective>".
HOST_COLLECTIVE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")
HOST_ALLREDUCE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):all_?reduce")
HOST_ALLGATHER = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):_?all_?gather")
HOST_REDUCE_SCATTER = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):_?reduce_?scatter")
# gloo has no reduce-scatter of its own: torch 2.13 runs `c10d::_reduce_scatter_base_` (FSDP2's) as a
# `gloo:all_reduce` on its worker thread, so a gloo trace cannot tell it from a real all-reduce by name
REDUCE_SCATTER_ISSUE_OP = re.compile(r"^c10d::_?reduce_scatter")
# A barrier synchronises ranks and carries no data: the profiled pass puts one before every step (inside the
# ProfilerStep range), so the witness of exposed communication leaves it out. On the host it is
# `<backend>:barrier` (gloo's worker thread); on a GPU NCCL runs it as a one-element all-reduce kernel,
# recognisable only by its launch inside the `c10d::barrier` op.
HOST_BARRIER = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):barrier")
BARRIER_ISSUE_OP = re.compile(r"^c10d::barrier")
# The host side of communication, never compute: c10d's dispatcher ops (issue, and for blocking calls the
# wait), the args carrier record_param_comms, functional collectives' waits.
COLLECTIVE_HOST_OP = re.compile(r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms$)")
ALLREDUCE_ISSUE_OP = re.compile(r"^c10d::allreduce")
COLLECTIVE_ARGS_EVENT = "record_param_comms"
# its args name the collective (torch/csrc/profiler/util.h kCommsName); current torch puts them on NCCL
# kernels too
COLLECTIVE_NAME_ARG = "Collective name"
DATALOADER = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")  # TensorBoard's "DataLoader" category

# The engines' and the bench worker's record_function labels (ddp_core/buckets.py, ddp_core/distributed.py,
# bench/worker/trainer.py `Trainer.step`).
DDP_CORE_ALLREDUCE = re.compile(r"^ddp_core\.allreduce\.(bucket\d+|param\..+)$")
BACKWARD_LABEL = "backward"
AUTOGRAD_BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function:")


def cat_mask(trace: Trace, allowed: frozenset) -> np.ndarray:
    """Per event: is its (lower-cased) category in `allowed`."""
    hit = np.fromiter((c in allowed for c in trace.cats), dtype=bool, count=len(trace.cats))
    return hit[trace.cat_id] if len(hit) else np.zeros(len(trace), dtype=bool)


def name_mask(trace: Trace, pattern: re.Pattern | str) -> np.ndarray:
    """Per event: does its name match `pattern` (re.search), or equal it when `pattern` is a string."""
    test = (lambda n: n == pattern) if isinstance(pattern, str) else (
        lambda n: isinstance(n, str) and pattern.search(n) is not None)
    hit = np.fromiter((test(n) for n in trace.names), dtype=bool, count=len(trace.names))
    return hit[trace.name_id] if len(hit) else np.zeros(len(trace), dtype=bool)


def host_mask(trace: Trace) -> np.ndarray:
    """Host (CPU-side) events: operators and annotations."""
    return cat_mask(trace, HOST_OP_CATS | {ANNOTATION_CAT})


def gpu_classes(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """gpu_class of each event in `rows` (evaluated once per distinct name and category)."""
    cache: dict[tuple[int, int], int] = {}
    out = np.empty(len(rows), dtype=np.int8)
    for k, (n, c) in enumerate(zip(trace.name_id[rows], trace.cat_id[rows])):
        key = (n, c)
        if key not in cache:
            cache[key] = gpu_class(trace.names[n], trace.cats[c])
        out[k] = cache[key]
    return out


# --- message sizes --------------------------------------------------------------------------------------
# Bytes per element for the dtype spellings Kineto writes: c10 ScalarType names in record_param_comms'
# `dtype` ("Float", "BFloat16"), C++ type names in record_shapes' `Input type` ("float", "c10::Half").
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2,
    "long": 8, "long int": 8, "int64_t": 8, "int": 4, "int32_t": 4, "short": 2, "short int": 2,
    "byte": 1, "unsigned char": 1, "char": 1, "signed char": 1, "bool": 1, "uint8_t": 1, "int8_t": 1,
    "complexfloat": 8, "complexdouble": 16, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}


def busbw_factor(collective: str, n: int) -> float | None:
    """nccl-tests' bus-bandwidth factor for a collective over n ranks (PERFORMANCE.md); None if unknown."""
    c = collective.lower().replace("_", "")
    if c == "barrier":  # a synchronisation: no payload on the bus
        return 0.0
    if "allreduce" in c:
        return 2 * (n - 1) / n
    if "allgather" in c or "reducescatter" in c or "alltoall" in c:
        return (n - 1) / n
    if c in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    return None
