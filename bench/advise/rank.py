"""One recipe's configurations, ranked by throughput with intervals and ties (advice.csv's measured half).

A recipe is the global batch per optimizer step (results.csv `global_batch` = per_rank_batch × world_size ×
grad_accum) at the run's largest measured world size: what a user's training recipe fixes (convergence, the
learning-rate schedule), where the DDP settings (engine, bucket size, gradient dtype, comm hook, the
accumulation split, precision, static graph, compile) are theirs to choose. Every ranked row trains it, so a
bigger batch cannot win on samples/s. Default: the recipe with the most ok configurations there, then the
one with a torch DDP cell, then the largest global batch (a fixed order, so two runs of a preset agree).

Ranking by medians alone would pick a winner by noise: a configuration whose 95 % throughput interval
overlaps the best one's is `tied_with_best`. Throughput's interval is the step-time interval carried over
(samples/s = global batch / step, bounds swapped), as the report's scaling tables carry it.
"""

from __future__ import annotations

import pandas as pd

from bench import engines
from bench.schema import CONFIG_KEYS

# Always in advice.csv, in this order: the settings a user picks at a fixed recipe (per_rank_batch with
# grad_accum is the accumulation split; engine_options the hook, static graph, bucket views, compile).
CHOICE_KEYS = ("engine", "bucket_cap_mb", "precision", "comm_dtype", "grad_accum", "per_rank_batch",
               "engine_options")
# Not choices: fixed by the recipe (global_batch, world_size) or a label of the sweep that made the cell
# (scaling: at one world size and recipe, strong and weak cells differ only in name).
NOT_CHOICES = ("world_size", "global_batch", "scaling")
MEASURED = ("world_size", "global_batch", "samples_per_s", "samples_per_s_ci95_low",
            "samples_per_s_ci95_high")
# memory a job is sized by, best first (docs/design.md "Memory"): what the GPU holds for the process, what
# torch's allocator reserved, what it allocated (on CPU the peak RSS)
MEMORY_COLUMNS = ("device_used_mb", "peak_reserved_mb", "peak_mem_mb")


class UsageError(ValueError):
    """A bad argument, or a run with nothing to advise: the message names the key and the value."""


def ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Cells with a measured throughput (status ok)."""
    return results[(results["status"] == "ok") & results["samples_per_s"].notna()]


def largest_world_size(results: pd.DataFrame) -> int | None:
    ok = ok_rows(results)
    return int(ok["world_size"].max()) if len(ok) else None


def recipes(results: pd.DataFrame) -> pd.DataFrame:
    """The recipes at the largest measured world size, the default first (module docstring): global_batch,
    configurations (ok cells), has_torch."""
    n = largest_world_size(results)
    at_n = ok_rows(results)
    at_n = at_n[at_n["world_size"] == n]
    reference = engines.reference().name
    table = at_n.groupby("global_batch").agg(configurations=("cell_id", "size"),
                                             has_torch=("engine", lambda e: bool((e == reference).any())))
    table = table.reset_index().astype({"global_batch": int})
    return table.sort_values(["configurations", "has_torch", "global_batch"], ascending=False,
                             kind="stable").reset_index(drop=True)


def choose_recipe(results: pd.DataFrame, global_batch: int | None) -> tuple[int, list[int]]:
    """(the recipe, the run's other recipes at that world size); UsageError naming --global-batch when the
    run did not measure it there."""
    table = recipes(results)
    held = list(table["global_batch"])
    if global_batch is None:
        return held[0], held[1:]
    if global_batch not in held:
        raise UsageError(f"--global-batch={global_batch}: not measured at the largest world size "
                         f"({largest_world_size(results)} ranks); this run has {sorted(held)}")
    return global_batch, [b for b in held if b != global_batch]


def choice_keys(results: pd.DataFrame) -> list[str]:
    """CHOICE_KEYS, then every other configuration key the run holds at several values (a second model)."""
    others = [k for k in CONFIG_KEYS if k not in CHOICE_KEYS and k not in NOT_CHOICES
              and results[k].dropna().astype(str).nunique() > 1]
    return [*CHOICE_KEYS, *others]


def memory_of(row: pd.Series) -> tuple[float, str]:
    """(MiB, column) of the best memory figure the row has (MEMORY_COLUMNS order); (NaN, "") when none."""
    for column in MEMORY_COLUMNS:
        if column in row.index and pd.notna(row[column]):
            return float(row[column]), column
    return float("nan"), ""


def throughput_interval(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(low, high) samples/s from the step-time interval: global batch / step, bounds swapped."""
    nan = pd.Series(float("nan"), index=rows.index)
    if "step_time_ms_ci95_high" not in rows or "step_time_ms_ci95_low" not in rows:
        return nan, nan
    return rows["global_batch"] / rows["step_time_ms_ci95_high"] * 1e3, \
        rows["global_batch"] / rows["step_time_ms_ci95_low"] * 1e3


def rank_recipe(results: pd.DataFrame, recipe: int, memory_gb: float | None = None) -> pd.DataFrame:
    """The recipe's rows at the largest measured world size: the ok configurations within `memory_gb`
    ranked 1.. by samples/s (`tied_with_best` when the interval overlaps rank 1's), then the ok ones over it
    and the cells that failed, diverged, timed out, ran out of memory or were skipped there (rank empty,
    `why` gives the reason). `memory_mb` is the row's MEMORY_COLUMNS figure, `why` names which."""
    n = largest_world_size(results)
    keys = choice_keys(results)
    here = results[(results["world_size"] == n) & (results["global_batch"] == recipe)].copy()
    here["memory_mb"], here["memory_column"] = zip(*(memory_of(r) for _, r in here.iterrows()))
    low, high = throughput_interval(here)
    table = here.assign(samples_per_s_ci95_low=low, samples_per_s_ci95_high=high, why="")
    ok = (table["status"] == "ok") & table["samples_per_s"].notna()
    over = pd.Series(False, index=table.index)
    if memory_gb is not None:
        over = ok & (table["memory_mb"] > memory_gb * 1024)
        table.loc[over, "why"] = [
            f"excluded: {m:,.0f} MiB ({c}) is over --memory-gb {memory_gb:g} ({memory_gb * 1024:,.0f} MiB)"
            for m, c in zip(table.loc[over, "memory_mb"], table.loc[over, "memory_column"])]
    admitted = table[ok & ~over].sort_values("samples_per_s", ascending=False, kind="stable")
    admitted = admitted.assign(rank=range(1, len(admitted) + 1), tied_with_best=False)
    if len(admitted):
        best = admitted.iloc[0]
        # overlap: this row's upper bound reaches the best one's lower bound (no interval: not a tie)
        admitted["tied_with_best"] = (admitted["samples_per_s_ci95_high"] >= best["samples_per_s_ci95_low"]) \
            & (admitted["rank"] > 1)
        admitted["why"] = [_why(r, best) for _, r in admitted.iterrows()]
    failed = table[~ok].assign(why=[f"{s}: {first_line(e)}" for s, e in
                                    zip(table.loc[~ok, "status"], table.loc[~ok, "error"])])
    out = pd.concat([admitted, table[over], failed])
    out["rank"] = out["rank"].astype("Int64")
    out["tied_with_best"] = out["tied_with_best"].fillna(False).astype(bool)
    out["world_size"] = out["world_size"].astype(int)
    return out[["rank", "tied_with_best", "status", *keys, *MEASURED, "memory_mb", "cell_id", "why"]] \
        .reset_index(drop=True)


# a failed cell's cause in the advice: its error's first line (the exception, bench.schema.error_text), cut
# here; the whole error (traceback tail, a user module's repr) stays in results.csv and the launch's logs
CAUSE_CHARS = 160


def first_line(error) -> str:
    """The cause of a failure in one line: the error's first line, at most CAUSE_CHARS characters."""
    if not isinstance(error, str) or not error.strip():
        return "no reason recorded"
    line = error.strip().splitlines()[0].strip()
    return line if len(line) <= CAUSE_CHARS else line[:CAUSE_CHARS - 1] + "…"


def _why(r: pd.Series, best: pd.Series) -> str:
    mem = f"; {r['memory_mb']:,.0f} MiB ({r['memory_column']})" if r["memory_column"] else ""
    if r["rank"] == 1:
        return "highest median throughput at this recipe" + mem
    if pd.isna(r["samples_per_s_ci95_high"]) or pd.isna(best["samples_per_s_ci95_low"]):
        return "no throughput interval recorded" + mem
    below = (1 - r["samples_per_s"] / best["samples_per_s"]) * 100
    if r["tied_with_best"]:  # a comparison with the best row, not with the baseline: no verdict words here
        return f"{below:.1f} % below the best's median; its throughput interval overlaps the best one's" + mem
    return f"{below:.1f} % below the best's median; the two throughput intervals do not overlap" + mem
