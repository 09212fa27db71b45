"""A run folder's layout (results/<run-id>/, docs/design.md "Run folder"): the name of every file and folder
in it, each spelled here once; writers and readers use these names (tests/test_layout.py checks that no
other module spells one)."""

from __future__ import annotations

# ---- the files of a run folder ---------------------------------------------------------------------------
CONFIG = "config.toml"            # the resolved configuration (--resume compares against it)
ENV = "env.json"                  # machine and software fingerprint
CELLS = "cells.jsonl"             # append-only records, the source of truth
RESULTS = "results.csv"           # derived from cells.jsonl after every cell
SWEEP = "allreduce_sweep.csv"     # the probe's size sweep, derived with results.csv
ANATOMY = "anatomy.json"          # where the last `bench run` into it spent its time (anatomy.PARTS)
LOCK = ".lock"                    # held by the run writing into the folder
LOGS = "logs"                     # launch plans, commands, outputs, events, NCCL logs
EVENTS = "events"                 # the workers' events of a run launched by the user's own torchrun/srun
NODE_ENV_GLOB = "env-*.json"      # per node of such a run (its worker's local rank 0), merged by --collect
PLAN = "plan.json"                # `bench run --plan-only`: the cells for the user's own torchrun/srun
SBATCH = "job.sbatch"             # `bench slurm`: the job script it wrote (and submitted, with --submit)
SLURM_JOB_ID = "slurm-job-id"     # under LOGS: the job `bench slurm --submit` follows
SLURM_OUTPUT = "slurm-%j.out"     # under LOGS: the job's output (sbatch --output; %j is the job id)
TRACES = "traces"                 # traces/<cell_id>/rank<r>.<ts>.pt.trace.json.gz
# under LOGS, per launch k of `bench run` (bench/run/launch.py): launch-<k>.<part>
LAUNCH_PARTS = (PLAN, "events.jsonl", "cmd", "out", "err", "pid")


def node_env(host: str) -> str:
    """The file a node's local rank 0 writes in a plan run: env-<host>.json."""
    return f"env-{host}.json"


def nccl_log_file(k: int) -> str:
    """Under LOGS: launch k's NCCL_DEBUG_FILE pattern (%h host, %p pid: one file per rank)."""
    return f"nccl-launch-{k}.%h.%p.log"


def nccl_plan_log_file(world_size: int | str) -> str:
    """Under LOGS: a plan run's NCCL_DEBUG_FILE pattern for its world size (`bench slurm`'s script sets it;
    `--collect` reads it): one file per rank."""
    return f"nccl-ws{world_size}.%h.%p.log"


def launch_file(k: int | str, part: str) -> str:
    """Launch k's file under LOGS: launch-<k>.<part>, part one of LAUNCH_PARTS (k "*": a glob of all)."""
    if part not in LAUNCH_PARTS:
        raise ValueError(f"part={part!r}: not one of {LAUNCH_PARTS}")
    return f"launch-{k}.{part}"


# written by `bench analyze RUN` (bench.analyze.summary.TABLES has their columns)
TRACE_SUMMARY = "trace_summary.csv"
BUCKET_TIMELINE = "bucket_timeline.csv"
IDLE_BREAKDOWN = "idle_breakdown.csv"
LAUNCH_STATS = "launch_stats.csv"
STRAGGLERS = "stragglers.csv"
KERNEL_CLASSES = "kernel_classes.csv"
WITNESSES = "witnesses.csv"
COLLECTIVE_WAIT = "collective_wait.csv"  # each rank's collectives split into wait and transfer
RANK_TIMELINE = "rank_timeline.csv"      # one step per multi-rank job: each rank's compute, wait, transfer
# written by `bench project RUN`, under PROJECTION_DIR
PROJECTION_DIR = "projection"
PROJECTION = "projection.csv"
PROJECTION_NOTES = "notes.txt"    # the caveats `bench project` printed, one a line
VALIDATION = "validation.csv"     # the projection against the world sizes the run measured
NETWORK_FIT = "network_fit.csv"   # the measured network's α-β fits
# notes.txt lines starting with this name where one configuration's straggler, interference and host-floor
# terms came from (one per configuration: a table in the report, not part of the printed or advised caveats)
PHYSICS_NOTE = "physics of "
# written by `bench advise RUN`, under ADVICE_DIR (its projection to the target in ADVICE_DIR/projection)
ADVICE_DIR = "advice"
ADVICE_MD = "advice.md"           # the short answer, the caveats, the ranking
ADVICE_CSV = "advice.csv"         # one row per configuration of the recipe, ranked, with its speedup
BEST_TOML = "best.toml"           # a ddpbench config: the advised configuration, its baseline, at the target
DDP_MD = "ddp.md"                 # the advised settings for the user's own script, and the launch lines
