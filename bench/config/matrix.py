"""The matrix section: the axes of the sweep (bench.matrix expands their cross product into cells)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from bench import engines
from bench.config.checks import MAX_BUCKET_MB, MAX_STEPS, MAX_WORLD_SIZE, check_choices, check_min, fail
from bench.schema import (
    COMM_DTYPE_ALIASES,
    COMM_DTYPES,
    DEFAULT_BUCKET_MB,
    ENGINE_OPTIONS,
    PRECISIONS,
    SCALINGS,
)


def _engine_names() -> tuple[str, ...]:
    """The registered engines; a plug-in that cannot be added is a config error naming the variable."""
    try:
        return engines.names()
    except engines.PluginError as exc:
        fail(engines.PLUGIN_VARIABLE, os.environ.get(engines.PLUGIN_VARIABLE), str(exc))


def _default_engines() -> tuple[str, ...]:
    _engine_names()  # a plug-in that cannot be added is a config error here too
    return engines.default_sweep()


@dataclass(frozen=True)
class _MatrixAxes:
    """The axes every engine has: each a list, the sweep is their cross product (see bench.matrix)."""

    # the engines (bench/engines/ is their registry); default: those in the default sweep (not fsdp2)
    engine: tuple[str, ...] = field(default_factory=_default_engines)
    world_size: tuple[int, ...] = (1, 2)  # ranks of a cell (one GPU each on CUDA)
    # the engine's gradient bucket cap in MiB (torch DDP's bucket_cap_mb; fsdp2 has no buckets)
    bucket_cap_mb: tuple[float, ...] = (DEFAULT_BUCKET_MB,)
    # fp32; tf32 (fp32 with TF32 matmuls and convolutions); bf16 | fp16: autocast over fp32 parameters
    # (fp16 with a GradScaler)
    precision: tuple[str, ...] = ("fp32",)
    # what the gradients' all-reduce carries: none (their own fp32) | fp16 | bf16 (cast for the all-reduce
    # and back); "fp32" is read as none
    comm_dtype: tuple[str, ...] = ("none",)
    grad_accum: tuple[int, ...] = (1,)  # micro-steps per optimizer step, all but the last under no_sync()
    # strong | weak: the batch rule (workload.global_batch or workload.per_rank_batch: WorkloadConfig)
    scaling: tuple[str, ...] = ("strong",)

    @staticmethod
    def vocabulary() -> dict[str, tuple]:
        """The values each key of the section may take, where it has a vocabulary (what __post_init__
        checks and docs/reference.md lists)."""
        return {"engine": _engine_names(), "precision": PRECISIONS,
                "comm_dtype": COMM_DTYPES + tuple(COMM_DTYPE_ALIASES), "scaling": SCALINGS,
                **{o.name: o.choices for o in ENGINE_OPTIONS if o.choices}}

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not getattr(self, f.name):
                fail(f"matrix.{f.name}", list(getattr(self, f.name)), "must list at least one value")
        vocabulary = self.vocabulary()
        check_choices("matrix.engine", self.engine, vocabulary["engine"])
        check_min("matrix.world_size", self.world_size, 1, maximum=MAX_WORLD_SIZE)
        check_min("matrix.bucket_cap_mb", self.bucket_cap_mb, 0, strict=True, maximum=MAX_BUCKET_MB)
        check_choices("matrix.precision", self.precision, vocabulary["precision"])
        check_choices("matrix.comm_dtype", self.comm_dtype, vocabulary["comm_dtype"])
        # aliases resolved here, once: everything after the config sees only COMM_DTYPES
        resolved = tuple(dict.fromkeys(COMM_DTYPE_ALIASES.get(c, c) for c in self.comm_dtype))
        object.__setattr__(self, "comm_dtype", resolved)
        check_min("matrix.grad_accum", self.grad_accum, 1, maximum=MAX_STEPS)
        check_choices("matrix.scaling", self.scaling, vocabulary["scaling"])
        for option in ENGINE_OPTIONS:
            key, values = f"matrix.{option.name}", getattr(self, option.name)
            if option.choices:
                check_choices(key, values, option.choices)
            if option.limits:
                check_min(key, values, option.limits[0], maximum=option.limits[1])
        for key in ("options_cells", "cells"):
            for pattern in getattr(self, key):
                if not isinstance(pattern, str) or not pattern.strip():
                    fail(f"matrix.{key}", pattern, "must be a glob pattern over cell ids (\"*-ws2-*\")")
        casts = [h for h in self.comm_hook if h in COMM_DTYPES and h != "none"]
        if casts and any(c != "none" for c in self.comm_dtype):
            fail("matrix.comm_hook", casts[0], f"is torch's comm_dtype={casts[0]} under its hook's name; "
                 f"with matrix.comm_dtype={list(self.comm_dtype)} set only one of the two")

    def check_options_apply(self, keys) -> None:
        """Each engine option in `keys` must apply to a listed engine, and beside its companion's value."""
        for option in ENGINE_OPTIONS:
            if option.name not in keys:
                continue
            takers = [e for e in _engine_names() if option.name in engines.get(e).options]
            if not set(takers) & set(self.engine):
                fail(f"matrix.{option.name}", list(getattr(self, option.name)), f"applies to engine {takers} "
                     f"only; matrix.engine={list(self.engine)} lists none of them")
            if option.beside and option.beside[1] not in getattr(self, option.beside[0]):
                fail(f"matrix.{option.name}", list(getattr(self, option.name)),
                     f"applies only with matrix.{option.beside[0]}={option.beside[1]}")


# The matrix section: the axes above, then one axis per engine option (bench.schema.ENGINE_OPTIONS: a new
# option is a row there, not a field here), each a list whose first value is the engine's own default and
# which is swept only for the engines that take it; then options_cells, then cells.
MatrixConfig = dataclasses.make_dataclass(
    "MatrixConfig",
    [*((o.name, tuple[o.kind, ...], field(default=(o.default,))) for o in ENGINE_OPTIONS),
     # glob patterns (fnmatch) over a cell's id without its option words (`Cell.base_id`): a cell that sets
     # an engine option away from its default, or of an engine outside the default sweep (fsdp2), is swept
     # only where one matches; "*": everywhere (a preset's slice of the options, default.toml)
     ("options_cells", tuple[str, ...], field(default=("*",))),
     # glob patterns over the whole cell id: only the cells one matches are swept ("*": all); how a config
     # names exact cells out of the cross product (`bench advise` writes advice/best.toml: the advised
     # configuration and its baseline)
     ("cells", tuple[str, ...], field(default=("*",)))],
    bases=(_MatrixAxes,), frozen=True)
MatrixConfig.__module__ = __name__
MatrixConfig.__doc__ = ("The sweep's axes (bench.matrix): every engine's, the engine options, options_cells, "
                        "cells.")
