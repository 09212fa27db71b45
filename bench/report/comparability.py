"""Whether runs can be compared, and what stands around the comparison: a refusal for CPU against GPU runs
(`mixed_devices`) or for runs without a configuration in common (`nothing_in_common`), the runs' environments
side by side (`env_differences`, and its short `difference_list`), and the warnings when their software or
their search differ."""

from __future__ import annotations

import pandas as pd

from bench.report import tables
from bench.report.compare import run_labels
from bench.report.environment import gpu_summary, machine_facts
from bench.run_folder import Run
from bench.schema import CONFIG_KEYS

# Software whose version changes timings by itself: comparing hardware across them needs a warning.
SOFTWARE_FIELDS = ("torch", "cuda", "cudnn", "nccl", "driver")


def mixed_devices(runs: list[Run]) -> str:
    """Why these runs must not be compared (CPU with GPU), or '' when they share a device kind."""
    devices = {r.name: r.device for r in runs}
    if len(set(devices.values())) <= 1:
        return ""
    listing = ", ".join(f"{name} is {dev}" for name, dev in devices.items())
    return (
        f"refusing to compare runs on different devices ({listing}): CPU processes over gloo and GPUs over "
        f"NCCL measure different things, and docs/design.md keeps CPU numbers out of GPU comparisons. "
        f"Pass --allow-mixed-devices to compare them anyway."
    )


# What a user chose when making a run, in the words of `nothing_in_common`: (label, how to read it off a run).
_RUN_SHAPE = (
    ("preset", lambda r: [str(r.config.get("description") or r.env.get("command") or "?")]),
    ("model", lambda r: sorted({f"{m}/{s}" if s else m for m, s in zip(r.results["model"],
                                                                       r.results["model_size"])})),
    ("engines", lambda r: sorted(set(r.results["engine"]))),
    ("world sizes", lambda r: [str(n) for n in tables.world_sizes(r.results)]),
    ("precisions", lambda r: sorted(set(r.results["precision"]))),
    ("global batches", lambda r: [f"{b:g}" for b in sorted(set(r.results["global_batch"].dropna()))]),
)


def nothing_in_common(runs: list[Run]) -> str:
    """Why nothing can be compared — a run shares no configuration (bench.schema.CONFIG_KEYS) with the
    baseline — and how the two differ; '' when every run shares at least one."""
    labels = run_labels(runs)
    base = set(tables.config_key(runs[0].results, CONFIG_KEYS))
    for label, run in zip(labels[1:], runs[1:]):
        if base & set(tables.config_key(run.results, CONFIG_KEYS)):
            continue
        differs = [f"{what}: {', '.join(get(runs[0]))} vs {', '.join(get(run))}"
                   for what, get in _RUN_SHAPE if get(runs[0]) != get(run)]
        return (f"{labels[0]} and {label} have no configuration in common (cells are matched on "
                f"{', '.join(CONFIG_KEYS)}), so nothing can be compared. They differ in "
                + ("; ".join(differs) or "how their cells are configured") + ".")
    return ""


def env_differences(runs: list[Run]) -> pd.DataFrame:
    """One row per environment field, one column per run, and whether the runs differ on it."""
    fields = {
        "device": lambda r: r.device,
        "GPU": lambda r: gpu_summary(r.env),
        "GPU count": lambda r: r.env.get("gpu_count"),
        "driver": lambda r: r.env.get("driver"),
        "cuda": lambda r: r.env.get("cuda"),
        "cudnn": lambda r: r.env.get("cudnn"),
        "nccl": lambda r: r.env.get("nccl"),
        "torch": lambda r: r.env.get("torch"),
        "backend": lambda r: r.env.get("backend"),
        "python": lambda r: r.env.get("python"),
        "cpu": lambda r: r.env.get("cpu_model"),
        "topology": lambda r: r.env.get("topology"),
        "hostname": lambda r: r.env.get("hostname"),
        "git sha": lambda r: r.env.get("git_sha"),
    }
    per_run = [{name: get(r) for name, get in fields.items()} for r in runs]
    for values, r in zip(per_run, runs):
        values.update({field: value for field, value, _ in machine_facts(r.env)})
    # every variable set in some run's env_vars (one set in one run only differs too)
    for var in sorted({k for r in runs for k in (r.env.get("env_vars") or {})}):
        for values, r in zip(per_run, runs):
            values[var] = (r.env.get("env_vars") or {}).get(var)
    labels = run_labels(runs)
    rows = []
    for name in per_run[0]:
        values = ["" if v[name] is None else str(v[name]) for v in per_run]
        rows.append({"field": name, **dict(zip(labels, values)), "differs": len(set(values)) > 1})
    return pd.DataFrame(rows)


# Fields that differ between any two runs and say nothing about the machine
_NOT_MACHINE = ("hostname", "git sha")


def difference_list(diff: pd.DataFrame) -> list[str]:
    """The short list for the summary: 'field: a vs b' for each machine fact or variable that differs
    (multi-line values such as the topology are named, not quoted)."""
    value_cols = [c for c in diff.columns if c not in ("field", "differs")]
    out = []
    for _, r in diff[diff["differs"] & ~diff["field"].isin(_NOT_MACHINE)].iterrows():
        values = [r[c] or "unset" for c in value_cols]
        if any("\n" in v or len(v) > 80 for v in values):
            out.append(f"{r['field']}: differs (see the table)")
        else:
            out.append(f"{r['field']}: " + " vs ".join(values))
    return out


def software_warning(diff: pd.DataFrame) -> str:
    """A warning naming the software versions that differ ('' when they all match)."""
    differing = diff[diff["field"].isin(SOFTWARE_FIELDS) & diff["differs"]]
    if not len(differing):
        return ""
    value_cols = [c for c in diff.columns if c not in ("field", "differs")]
    parts = [
        f"{r['field']} " + " vs ".join(r[c] or "none" for c in value_cols) for _, r in differing.iterrows()
    ]
    return (
        "Software versions differ (" + "; ".join(parts) + "): part of every difference below may come "
        "from the software, not the hardware."
    )


def search_warning(runs: list[Run]) -> str:
    """A warning when the runs searched differently (run.search: grid, race, race-all-sizes), '' else: a
    race stops the slower configurations early (their rows partial, not compared) and measures only the
    survivors fully, so the cells the runs share and their precision differ by design."""
    searches = [str(r.config.get("run", {}).get("search", "grid")) for r in runs]
    if len(set(searches)) < 2:
        return ""
    return (f"The runs searched differently (run.search {' vs '.join(searches)}): a race measures only its "
            f"survivors fully and stops the rest early (raced_out, left out here), so the configurations "
            f"compared are those both measured fully; compare runs of one search for a like-for-like view.")
