"""The run's ledger beside what it measured: the cells without numbers (`not_measured`), the cells a racing
search eliminated (`raced_out`), and where the run's wall time went (`anatomy_run_table`, per cell
`anatomy_cells_table`). Each a function from the run's rows or files to a DataFrame, as tables.py's."""

from __future__ import annotations

import pandas as pd

from bench import anatomy
from bench.report.tables import CELL_COLUMNS
from bench.schema import ROUND_FIGURES, partial_race_row


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell whose status is neither ok nor raced_out (a race's eliminations are `raced_out` below),
    with its reason."""
    bad = df[~df["status"].isin(("ok", "raced_out"))]
    return bad[list(CELL_COLUMNS)].rename(columns={"error": "reason"}).reset_index(drop=True)


# A raced_out row's own columns (bench/schema.py RACE_COLUMNS), after the recipe it raced in
RACED_OUT_COLUMNS = ("cell_id", "world_size", "global_batch", "race_round", "race_against", "race_slowdown",
                     "race_slowdown_low", "race_slowdown_high", "race_p", "race_level", "race_paired",
                     "n_timed_steps", "step_time_ms_p50")


def raced_out(df: pd.DataFrame) -> pd.DataFrame:
    """The cells a racing search eliminated (status raced_out), by world size, recipe and the round they
    went out at, with the comparison that eliminated each; empty for a run without any."""
    rows = df[df["status"] == "raced_out"].copy()
    if partial_race_row("raced_out", run_launches(df)):  # a folder written before its rows left them out
        rows[[c for c in ROUND_FIGURES if c in RACED_OUT_COLUMNS and c in rows]] = float("nan")
    cols = [c for c in RACED_OUT_COLUMNS if c in rows]
    return rows[cols].sort_values([c for c in ("world_size", "global_batch", "race_round") if c in cols],
                                  kind="stable").reset_index(drop=True)


def run_launches(df: pd.DataFrame) -> int:
    """The launches the run timed its cells in: the most any row has (1 without any: a plan run's rows)."""
    most = pd.to_numeric(df.get("launches"), errors="coerce").max() if "launches" in df else float("nan")
    return int(most) if most == most else 1


def anatomy_run_table(data: dict) -> pd.DataFrame:
    """Where the run's wall time went (RUN/anatomy.json, anatomy.PARTS): per part its scope, seconds
    and share of the wall time, in that order, then what no part covers."""
    wall = float(data.get("wall_s") or 0.0)
    rows = [{"part": p, "scope": anatomy.PARTS[p][0], "seconds": round(s, 2),
             "share_pct": round(100 * s / wall, 1) if wall else None, "what": anatomy.PARTS[p][1]}
            for p, s in (data.get("parts") or {}).items() if p in anatomy.PARTS]
    covered = sum(r["seconds"] for r in rows if r["part"] not in anatomy.CONCURRENT)
    rows.append({"part": "unaccounted", "scope": "run", "seconds": round(wall - covered, 2),
                 "share_pct": round(100 * (wall - covered) / wall, 1) if wall else None,
                 "what": f"of the wall time {wall:.1f} s, what no part holds"})
    return pd.DataFrame(rows)


def anatomy_cells_table(records: list[dict]) -> pd.DataFrame:
    """Each cell's parts of the cost anatomy (cells.jsonl `anatomy_s`), seconds, with its status: a raced-out
    cell shows what it cost before the race dropped it."""
    rows = [{"cell_id": r["cell_id"], "status": r.get("status"),
             **{p: round(r["anatomy_s"].get(p, 0.0), 3) for p in anatomy.CELL_PARTS},
             "total_s": round(sum(r["anatomy_s"].values()), 3)}
            for r in records if r.get("anatomy_s")]
    return pd.DataFrame(rows)
