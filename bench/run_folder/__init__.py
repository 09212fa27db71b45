"""A run folder (results/<run-id>/, docs/design.md "Run folder"), one concern a module: layout.py the name of
every file in it; ownership.py which command writes which part; safety.py whether a command may write into
an --out, and staging.py `writing`, which stages a command's files and publishes them; reading.py the one
reader of its records, rows, env.json and config.toml. The runner writes it (bench/run/); analyze, project
and report read it through here. Nothing here imports torch; pandas only where a table is read.

The names below are the package's public API: `from bench import run_folder; run_folder.RESULTS`.
"""

from bench.run_folder.layout import (
    ADVICE_CSV,
    ADVICE_DIR,
    ADVICE_MD,
    ANATOMY,
    BEST_TOML,
    BUCKET_TIMELINE,
    CELLS,
    COLLECTIVE_WAIT,
    CONFIG,
    DDP_MD,
    ENV,
    EVENTS,
    IDLE_BREAKDOWN,
    KERNEL_CLASSES,
    LAUNCH_PARTS,
    LAUNCH_STATS,
    LOCK,
    LOGS,
    NETWORK_FIT,
    NODE_ENV_GLOB,
    PHYSICS_NOTE,
    PLAN,
    PROJECTION,
    PROJECTION_DIR,
    PROJECTION_NOTES,
    RANK_TIMELINE,
    RESULTS,
    SBATCH,
    SLURM_JOB_ID,
    SLURM_OUTPUT,
    STRAGGLERS,
    SWEEP,
    TRACE_SUMMARY,
    TRACES,
    VALIDATION,
    WITNESSES,
    launch_file,
    nccl_log_file,
    nccl_plan_log_file,
    node_env,
)
from bench.run_folder.ownership import (
    NEW_RUN,
    OWN_DIR,
    OWNED,
    TOP_LEVEL_WRITERS,
    enclosing_run,
    own_part,
)
from bench.run_folder.reading import (
    Run,
    RunError,
    load_run,
    normalise,
    read_anatomy,
    read_records,
    read_results_csv,
)
from bench.run_folder.safety import (
    MARKER,
    STAGE_PREFIX,
    OutError,
    check_out,
    out_problem,
    written_by,
)
from bench.run_folder.staging import (
    writing,
)

__all__ = [
    "CONFIG", "ENV", "CELLS", "RESULTS", "SWEEP", "ANATOMY", "LOCK", "LOGS", "EVENTS", "NODE_ENV_GLOB",
    "PLAN", "SBATCH", "SLURM_JOB_ID", "SLURM_OUTPUT", "TRACES", "LAUNCH_PARTS", "TRACE_SUMMARY",
    "BUCKET_TIMELINE", "IDLE_BREAKDOWN", "LAUNCH_STATS", "STRAGGLERS", "KERNEL_CLASSES", "WITNESSES",
    "COLLECTIVE_WAIT", "RANK_TIMELINE", "PROJECTION_DIR", "PROJECTION", "PROJECTION_NOTES", "VALIDATION",
    "NETWORK_FIT", "PHYSICS_NOTE", "ADVICE_DIR", "ADVICE_MD", "ADVICE_CSV", "BEST_TOML", "DDP_MD",
    "node_env", "nccl_log_file", "nccl_plan_log_file", "launch_file", "NEW_RUN", "OWN_DIR", "OWNED",
    "TOP_LEVEL_WRITERS", "enclosing_run", "own_part", "Run", "RunError", "load_run", "normalise",
    "read_anatomy", "read_records", "read_results_csv", "MARKER", "STAGE_PREFIX", "OutError", "check_out",
    "out_problem", "written_by", "writing",
]
