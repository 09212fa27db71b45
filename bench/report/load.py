"""Read one results/<run-id>/ folder (DESIGN.md "Cell, result row and files") into pandas.

Strings stay strings ("" when empty); every other column is numeric with NaN for "not measured". A value
that breaks the contract (an unknown status, text in a number column) is an error naming the column.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.schema import CONTRACT_COLUMNS, RESULT_COLUMNS, STATUSES, STRING_COLUMNS


class RunError(ValueError):
    """A run folder that cannot be reported: missing files or rows that break the contract."""


@dataclass
class Run:
    """One run folder: its result rows, environment fingerprint and resolved config."""

    path: Path
    results: pd.DataFrame
    env: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def device(self) -> str:
        """ "cpu" or "cuda": env.json's word, else the rows' (a run never mixes devices)."""
        if self.env.get("device"):
            return str(self.env["device"])
        devices = sorted(set(self.results["device"]) - {""})
        return devices[0] if len(devices) == 1 else "unknown"


def _read_rows(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    csv_path, jsonl_path = run_dir / "results.csv", run_dir / "cells.jsonl"
    if csv_path.is_file():
        dtypes = {c: str for c in STRING_COLUMNS}
        return pd.read_csv(csv_path, dtype=dtypes, keep_default_na=False, na_values={}), []
    if jsonl_path.is_file():
        # An interrupted run has cells.jsonl but no results.csv yet: the same rows, one per line.
        rows = []
        for line in jsonl_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a last line cut short by a kill: that cell never finished
                continue
        df = pd.DataFrame(rows).drop(columns=["step_times_ms", "cell"], errors="ignore")
        return df, ["results.csv is missing; rows were read from cells.jsonl (the run may be incomplete)."]
    raise RunError(
        f"{run_dir}: neither results.csv nor cells.jsonl found (is this a results/<run-id>/ folder?)"
    )


def normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Typed columns in RESULT_COLUMNS order (extra runner columns kept after them)."""
    missing = [c for c in CONTRACT_COLUMNS if c not in df.columns]
    if missing:
        raise RunError(f"{source}: missing contract columns {missing}")
    df = df.copy()
    for col in RESULT_COLUMNS:
        if col not in df.columns:
            df[col] = "" if col in STRING_COLUMNS else float("nan")
    for col in df.columns:
        if col in STRING_COLUMNS:
            df[col] = df[col].fillna("").astype(str)
        elif col in RESULT_COLUMNS:
            blank = df[col].astype(str).str.strip().isin(["", "None", "nan"])
            values = pd.to_numeric(df[col].where(~blank), errors="coerce")
            bad = values.isna() & ~blank & df[col].notna()
            if bad.any():
                raise RunError(
                    f"{source}: column {col!r} holds non-numbers {sorted(set(df.loc[bad, col]))[:3]}"
                )
            df[col] = values.astype(float)
    unknown = sorted(set(df["status"]) - set(STATUSES))
    if unknown:
        raise RunError(f"{source}: unknown status {unknown}; expected one of {STATUSES}")
    extras = [c for c in df.columns if c not in RESULT_COLUMNS]
    return df[list(RESULT_COLUMNS) + extras].reset_index(drop=True)


def load_run(run_dir: Path | str) -> Run:
    """Load results, env.json and config.toml of `run_dir`; env and config may be absent (noted)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such run folder")
    raw, notes = _read_rows(run_dir)
    results = normalise(raw, str(run_dir))
    env, config = {}, {}
    if (run_dir / "env.json").is_file():
        env = json.loads((run_dir / "env.json").read_text())
    else:
        notes.append("env.json is missing: the environment fingerprint is unknown.")
    if (run_dir / "config.toml").is_file():
        config = tomllib.loads((run_dir / "config.toml").read_text())
    else:
        notes.append("config.toml is missing: the resolved preset is unknown.")
    return Run(path=run_dir, results=results, env=env, config=config, notes=notes)
