"""What-if without a run: a projection from a 1-GPU step time and a model, as a user has before any run
(`python -m bench project --spec FILE.toml | --model NAME[:SIZE] --step-ms T1 ...`; docs/projection.md).

The model is a built-in workload (`model` and `size`: its trainable parameters built on the meta device,
grouped by torch DDP's rule at `bucket_cap_mb`; bench/project/layout.py, imports torch), or a parameter
count (`params`: ddp_buckets below, no torch), or an explicit `bucket_sizes` list (wire bytes, issue order).
The compute side is `step_ms` split into forward and backward by `backward_share` (optimizer 0); the
buckets' gradients arrive uniformly over backward. The rows are projection.csv's (PROJECTION_COLUMNS), one
per world size, computed as run mode computes them (bench/project/project.py `project`).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from bench import engines
from bench.config import MAX_BATCH, MAX_BUCKET_MB, MAX_SECONDS, MAX_STEPS, MAX_WORLD_SIZE
from bench.project.collectives import ALGORITHMS
from bench.project.columns import PROJECTION_COLUMNS, typed
from bench.project.configuration import Configuration
from bench.project.network import FABRICS, INTER_NODE, preset_network
from bench.project.physics import DEFAULT_INTERFERENCE, DEFAULT_STEP_CV, Physics
from bench.project.project import project
from bench.project.sharded import MODES, Sharding, estimated_blocks, uniform_blocks
from bench.project.simulate import Buckets, Compute
from bench.schema import DEFAULT_BUCKET_MB, PRECISIONS, WIRE_DTYPES

# Backward does twice forward's FLOPs (gradients w.r.t. inputs and w.r.t. weights: Kaplan et al. 2020,
# §2.1), so 2/3 of a step is backward when nothing else is known.
DEFAULT_BACKWARD_SHARE = 2 / 3
# torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES): the first gradients to arrive go out early.
FIRST_BUCKET_BYTES = 2**20
DEFAULT_WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FP32_GRAD_BYTES = 4  # parameters are fp32 (AMP autocasts the math), so DDP reduces fp32 gradients
# Bounds that catch a typo before it becomes a projection of nothing (the run config's MAX_* are reused).
# A step shorter than 1 µs is below one kernel launch (a few µs on a GPU); longer than a week is no step.
MIN_STEP_MS = 1e-3
MAX_MS = MAX_SECONDS * 1e3
# 1e15 parameters: a thousand times the largest published dense models (~1e12)
MAX_PARAMS = 10**15
# σ (a spread in units of the step) and γ (ms of slowdown per ms overlapped): measured 0.02 and 0.155-0.425
# (bench/project/physics.py); ten is far beyond either
MAX_PHYSICS = 10.0
REQUIRED = ("step_ms", "per_gpu_batch")  # the keys without a default


class SpecError(ValueError):
    """A bad spec value: the message names the key and the value."""


@dataclass(frozen=True)
class Spec:
    """Everything a what-if projection needs (keys of the TOML file and of project_spec)."""

    step_ms: float
    per_gpu_batch: int
    model: str = ""
    size: str = ""
    params: int | None = None
    bucket_sizes: tuple[int, ...] | None = None
    precision: str = "fp32"
    comm_dtype: str = "none"
    bucket_cap_mb: float = DEFAULT_BUCKET_MB
    grad_accum: int = 1
    network: str = "h100-nvlink"
    gpus_per_node: int = 8
    nics_per_node: int | None = None   # NICs per node between nodes (None: one per GPU)
    inter_network: str = "ib-ndr400"
    algorithm: str = "auto"
    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
    backward_share: float = DEFAULT_BACKWARD_SHARE
    step_cv: float = DEFAULT_STEP_CV
    interference: float = DEFAULT_INTERFERENCE
    host_ms: float = 0.0
    sharding: str = "none"             # none (DDP), or a sharded engine's mode (sharded.MODES)
    blocks: int | None = None          # sharded: fully_shard groups (None: the model's, else the estimate)

    def __post_init__(self):
        def bad(key: str, why: str):
            raise SpecError(f"{key}={getattr(self, key)!r}: {why}")

        for key in ("model", "size", "precision", "comm_dtype", "network", "inter_network", "algorithm"):
            if not isinstance(getattr(self, key), str):  # a list, a number: never a name
                bad(key, "must be a string")
        if not _positive(self.step_ms) or not MIN_STEP_MS <= self.step_ms <= MAX_MS:
            bad("step_ms", f"must be a number of ms in [{MIN_STEP_MS:g}, {MAX_MS:g}] (the 1-GPU step time)")
        for key, most in (("per_gpu_batch", MAX_BATCH), ("grad_accum", MAX_STEPS),
                          ("gpus_per_node", MAX_WORLD_SIZE)):
            if not (_count(getattr(self, key)) and getattr(self, key) <= most):
                bad(key, f"must be an integer in [1, {most}]")
        if self.precision not in PRECISIONS:
            bad("precision", f"is not one of {list(PRECISIONS)}")
        if self.comm_dtype not in WIRE_DTYPES:
            bad("comm_dtype", f"is not one of {list(WIRE_DTYPES)}")
        if self.network not in FABRICS:
            bad("network", f"is not a preset; choose from {list(FABRICS)}")
        if self.inter_network not in INTER_NODE:
            bad("inter_network", f"is not one of {list(INTER_NODE)}")
        nics = self.nics_per_node
        if nics is not None and not (isinstance(nics, int) and nics >= 1):
            bad("nics_per_node", "must be an integer >= 1")
        if self.sharding != "none" and self.sharding not in MODES:
            bad("sharding", f"is not one of {['none', *MODES]}")
        if self.blocks is not None and not (isinstance(self.blocks, int) and self.blocks >= 1):
            bad("blocks", "must be an integer >= 1")
        if self.sharding != "none" and self.bucket_sizes is not None:
            bad("sharding", "needs params or a model (its parameters are sharded, not bucketed)")
        if self.algorithm not in ALGORITHMS:
            bad("algorithm", f"is not one of {list(ALGORITHMS)}")
        if not _positive(self.bucket_cap_mb) or self.bucket_cap_mb > MAX_BUCKET_MB:
            bad("bucket_cap_mb", f"must be a number in (0, {MAX_BUCKET_MB:g}]")
        if not (_number(self.backward_share) and 0 < self.backward_share <= 1):
            bad("backward_share", "must lie in (0, 1]")
        for key, most in (("step_cv", MAX_PHYSICS), ("interference", MAX_PHYSICS), ("host_ms", MAX_MS)):
            value = getattr(self, key)
            if not (_number(value) and 0 <= value <= most):
                bad(key, f"must be a number in [0, {most:g}]")
        if not isinstance(self.world_sizes, tuple) or not self.world_sizes or any(
                not (_count(n) and n <= MAX_WORLD_SIZE) for n in self.world_sizes):
            bad("world_sizes", f"must be a list of integers in [1, {MAX_WORLD_SIZE}]")
        given = [k for k in ("model", "params", "bucket_sizes") if getattr(self, k) not in (None, "", ())]
        if len(given) != 1:
            raise SpecError(f"model={self.model!r} params={self.params!r} "
                            f"bucket_sizes={self.bucket_sizes!r}: give exactly one of model (a workload), "
                            f"params (a count) or bucket_sizes")
        if self.params is not None and not (_count(self.params) and self.params <= MAX_PARAMS):
            bad("params", f"must be an integer in [1, {MAX_PARAMS:.0e}] (trainable parameters)")
        if self.bucket_sizes is not None and (not isinstance(self.bucket_sizes, tuple) or any(
                not (_count(b) and b <= MAX_BUCKET_MB * 2**20) for b in self.bucket_sizes)):
            bad("bucket_sizes", "must be a list of positive integers (bytes on the wire, each at most "
                f"{MAX_BUCKET_MB:g} MiB)")
        net = preset_network(self.network, self.gpus_per_node, self.inter_network, self.nics_per_node)
        for n in self.world_sizes:
            try:
                net.nodes(n)
            except ValueError:
                bad("world_sizes", f"{n} is not a multiple of gpus_per_node={self.gpus_per_node}")


def _number(value) -> bool:
    """A finite int or float (a TOML `true` is a bool, not a number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value) -> bool:
    """An integer >= 1 (not a bool: `params = true` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive(value) -> bool:
    return _number(value) and value > 0


def ddp_buckets(params: int, grad_bytes: int = FP32_GRAD_BYTES,
                cap_mb: float = DEFAULT_BUCKET_MB) -> Buckets:
    """torch DDP's buckets for `params` gradients without their layer shapes: 1 MiB first, then `cap_mb`
    MiB each, the remainder last; gradients arrive uniformly in bytes over backward, so bucket i is ready
    when the bytes of buckets 0..i are (the last at the end of backward: the exposed tail)."""
    total, cap = params * grad_bytes, int(cap_mb * 2**20)
    sizes = [min(total, FIRST_BUCKET_BYTES)]
    while sum(sizes) < total:
        sizes.append(min(cap, total - sum(sizes)))
    return _uniform(sizes, f"torch DDP layout of {params} parameters, uniform over backward")


def _uniform(sizes: list[int], source: str) -> Buckets:
    total, done, ready = sum(sizes), 0, []
    for s in sizes:
        done += s
        ready.append(done / total)
    return Buckets(tuple(sizes), tuple(ready), source)


def spec_buckets(spec: Spec) -> Buckets:
    """The spec's all-reduce messages (module docstring)."""
    wire = WIRE_DTYPES[spec.comm_dtype]
    if spec.bucket_sizes:
        return _uniform(list(spec.bucket_sizes), "spec bucket_sizes, uniform over backward")
    if spec.params:
        return ddp_buckets(spec.params, wire.bytes, spec.bucket_cap_mb)
    from bench.project.layout import engine_bucket_sizes, workload_options

    try:
        sizes = engine_bucket_sizes(engines.reference().name, spec.model, spec.size, spec.bucket_cap_mb,
                                    spec.comm_dtype, workload_options({}))
    except (ValueError, KeyError) as exc:
        raise SpecError(f"model={spec.model!r} size={spec.size!r}: {exc}") from None
    return _uniform(sizes, f"workload {spec.model}:{spec.size} layout, uniform over backward")


def project_spec(**keys) -> pd.DataFrame:
    """projection.csv's rows for a what-if (keys: Spec's fields). SpecError names a bad key and value."""
    return projection_of(spec_from_keys(keys))


# a count's suffixes, as model cards write parameter counts (360M, 1.5B, 7B)
COUNT_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
# the keys a what-if may give several values of, compared in one call (spec_grid): the DDP settings
LIST_KEYS = ("bucket_cap_mb", "comm_dtype", "grad_accum", "precision", "network")
MAX_WHAT_IFS = 1000  # combinations in one call: ~1 ms each (120,000 ran past 2 minutes)


def parse_count(key: str, text) -> int:
    """'360M', '1.5B', '1e9' or 250000 → an integer count; SpecError naming the key and the value."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    word = str(text).strip().replace("_", "")
    scale = COUNT_SUFFIXES.get(word[-1:].lower(), 1) if word[-1:].isalpha() else 1
    try:
        value = float(word[:-1] if scale != 1 else word) * scale
    except ValueError:
        raise SpecError(f"{key}={text!r}: not a count (e.g. 360M, 1.5B, 1e9, 250000)") from None
    if not math.isfinite(value) or value != int(value):
        raise SpecError(f"{key}={text!r}: must be a whole number")
    return int(value)  # its range is the Spec's to check (params=0 is named as such)


def spec_grid(keys: dict) -> list[dict]:
    """Every combination of the LIST_KEYS given as lists (a TOML list, or a comma-separated flag): one
    what-if each, in the order the values were given (the first key varies slowest)."""
    listed = [k for k in LIST_KEYS if isinstance(keys.get(k), (list, tuple))]
    count = math.prod(len(keys[k]) for k in listed)
    if count > MAX_WHAT_IFS:
        lists = ", ".join(f"{k}={len(keys[k])} values" for k in listed)
        raise SpecError(f"{lists}: {count} combinations; at most {MAX_WHAT_IFS} in one call (shorten the "
                        "lists, or compare them in several calls)")
    grid = [dict(keys)]
    for key in listed:
        values = list(keys[key])
        if not values:
            raise SpecError(f"{key}=[]: give at least one value")
        grid = [g | {key: v} for g in grid for v in values]
    return grid


def spec_from_keys(keys: dict) -> Spec:
    """A Spec from a dict of its keys (a TOML file's, or project_spec's); SpecError names a bad one."""
    if not isinstance(keys, dict):
        raise SpecError(f"spec={keys!r}: expected a table of spec keys")
    keys = dict(keys)
    if isinstance(keys.get("params"), (str, float)):
        keys["params"] = parse_count("params", keys["params"])
    known = {f.name for f in fields(Spec)}
    for key in keys:
        if key not in known:
            raise SpecError(f"{key}={keys[key]!r}: not a spec key; known: {sorted(known)}")
    missing = [k for k in REQUIRED if k not in keys]
    if missing:
        raise SpecError(f"{missing[0]}: missing (a spec needs {' and '.join(REQUIRED)}: the 1-GPU step time "
                        "in ms and the samples per GPU per micro-step)")
    for key in ("world_sizes", "bucket_sizes"):
        if isinstance(keys.get(key), list):
            keys[key] = tuple(keys[key])
    return Spec(**keys)


def spec_sharding(spec: Spec) -> tuple[Sharding, tuple[int, ...]] | None:
    """A sharded spec's mode and blocks: `blocks` equal groups of `params`, else the workload's fully_shard
    groups (bench/project/layout.py), else the transformer estimate; parameters gathered in the precision's
    dtype, gradients reduced in comm_dtype's (fp32 for none), every micro-step reducing."""
    if spec.sharding == "none":
        return None
    if spec.model and spec.blocks is None:
        from bench.project.layout import block_params, workload_options

        try:
            blocks = tuple(block_params(spec.model, spec.size, workload_options({})))
        except (ValueError, KeyError) as exc:
            raise SpecError(f"model={spec.model!r} size={spec.size!r}: {exc}") from None
    else:
        params = spec.params if spec.params else sum(spec_buckets(spec).sizes) // FP32_GRAD_BYTES
        blocks = uniform_blocks(params, spec.blocks or estimated_blocks(params))
    param_bytes = 2 if spec.precision in ("bf16", "fp16") else 4
    return Sharding(spec.sharding, param_bytes, WIRE_DTYPES[spec.comm_dtype].bytes), blocks


def projection_of(spec: Spec) -> pd.DataFrame:
    buckets = spec_buckets(spec)
    k = spec.grad_accum
    compute = Compute(forward_ms=spec.step_ms * (1 - spec.backward_share) * k,
                      backward_ms=spec.step_ms * spec.backward_share * k, optimizer_ms=0.0, grad_accum=k,
                      per_rank_batch=spec.per_gpu_batch)
    base = pd.Series({"cell_id": "spec",
                      "engine": engines.reference().name if spec.sharding == "none" else "sharded",
                      "model": spec.model or "(params)", "model_size": spec.size,
                      "bucket_cap_mb": spec.bucket_cap_mb, "precision": spec.precision,
                      "comm_dtype": spec.comm_dtype, "grad_accum": k, "scaling": "weak",
                      "per_rank_batch": spec.per_gpu_batch, "world_size": 1})
    config = Configuration(base, pd.DataFrame([base]), compute, buckets, sharded=spec_sharding(spec))
    net = preset_network(spec.network, spec.gpus_per_node, spec.inter_network, spec.nics_per_node)
    physics = Physics(step_cv=spec.step_cv, interference_factor=spec.interference, host_ms=spec.host_ms)
    rows = project(config, spec.network, lambda n, dtype: (net, net.label), sorted(set(spec.world_sizes)),
                   spec.algorithm, physics)
    return typed(pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS)))


def read_spec(path: Path) -> dict:
    """The TOML file's keys (top level, or a [spec] table)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"--spec={str(path)!r}: {exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"--spec={str(path)!r}: not a UTF-8 text file (a TOML file of spec keys)") from None
    spec = data.get("spec", data)
    if not isinstance(spec, dict):
        raise SpecError(f"--spec={str(path)!r}: spec={spec!r} is not a table of spec keys")
    return spec
