"""Run configuration: typed, frozen sections loaded from a TOML preset, overridden from the command line.

Precedence (lowest first): dataclass defaults < the preset's tables < the preset's `[on_cpu]` / `[on_cuda]`
table for the device the run resolves to < `--set section.key=value` from the command line.

Every value is checked when its section is built (`__post_init__`); what depends on the machine (GPU count,
precisions the device can run, CPU oversubscription) is checked by the run stage, bench/run/checks.py. A
bad value raises `ConfigError`, whose message names the key and the value; the CLI turns it into exit
code 2 before anything is created.

The package, one concern a module: checks.py (ConfigError, the checks, the bounds); one module per section
(matrix.py, workload.py, run.py, profile.py, debug.py) and sections.py (BenchConfig, the checks across
sections); convert.py (a value to its field's type); loading.py (presets, device tables, --set);
writing.py (the resolved config as TOML). The names below are the package's public API: import them from
bench.config.
"""

from bench.config.checks import (
    MAX_BATCH,
    MAX_BUCKET_MB,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_WORLD_SIZE,
    ConfigError,
    fail,
)
from bench.config.debug import DebugConfig
from bench.config.loading import config_from_dict, load_config, read_tables, resolve_path
from bench.config.matrix import MatrixConfig
from bench.config.profile import ProfileConfig
from bench.config.run import PG_TIMEOUT_SHARE, RunConfig, usable_cpus
from bench.config.sections import SECTIONS, BenchConfig
from bench.config.workload import WorkloadConfig
from bench.config.writing import to_toml, toml_value

__all__ = [
    "MAX_BATCH", "MAX_BUCKET_MB", "MAX_SECONDS", "MAX_STEPS", "MAX_WORLD_SIZE", "PG_TIMEOUT_SHARE",
    "SECTIONS",
    "BenchConfig", "ConfigError", "DebugConfig", "MatrixConfig", "ProfileConfig", "RunConfig",
    "WorkloadConfig", "config_from_dict", "fail", "load_config", "read_tables", "resolve_path", "to_toml",
    "toml_value", "usable_cpus",
]
