"""Reading a run folder back: its records (cells.jsonl), its rows (results.csv, cross-checked against the
records), env.json and config.toml, and the rows' types (`normalise`). Nothing here imports torch; pandas
only where a table is read.

Rows: strings stay strings ("" when empty); every other column is numeric with NaN for "not measured". A
value that breaks the contract (an unknown status, text in a number column, an empty comm_dtype) is an
error naming the column; a comm_dtype alias ("fp32", bench.schema.COMM_DTYPE_ALIASES) is read as what it
stands for ("none"), so the rest of the report sees the runner's spelling only.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.run_folder.layout import ANATOMY, CELLS, CONFIG, ENV, RESULTS
from bench.schema import (
    COMM_DTYPE_ALIASES,
    COMM_DTYPES,
    CONTRACT_COLUMNS,
    RESULT_COLUMNS,
    STATUSES,
    STRING_COLUMNS,
)

if TYPE_CHECKING:
    import pandas as pd


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


def read_records(run_dir: Path | str) -> list[dict]:
    """The latest record of every cell in cells.jsonl, in the order cells first appear (a line cut short by
    a kill is ignored): a later line for the same cell_id supersedes an earlier one (cells.jsonl stays
    append-only while a record is completed, e.g. its traces, written after the launch's timed steps)."""
    path = Path(run_dir) / CELLS
    if not path.is_file():
        return []
    rows: dict[str, dict] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a last line cut short by a kill: that cell never finished
            continue
        if isinstance(row, dict) and "cell_id" in row:
            rows[row["cell_id"]] = row  # dict order: first appearance; value: the last line
    return list(rows.values())


def read_anatomy(run_dir: Path | str) -> dict | None:
    """anatomy.json (where the last `bench run` into the folder spent its wall time, anatomy.PARTS), or
    None for a folder without one (older runs, plan runs)."""
    path = Path(run_dir) / ANATOMY
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_results_csv(run_dir: Path | str) -> pd.DataFrame:
    """results.csv as written: text columns as strings ("" when empty), the others as pandas reads them
    (RunError when it is not a readable CSV). `load_run` is the typed, cross-checked view of the rows."""
    return _read_csv(Path(run_dir) / RESULTS)


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_csv(path, dtype={c: str for c in STRING_COLUMNS}, keep_default_na=False, na_values={})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise RunError(f"{path}: not a readable CSV ({str(e).splitlines()[0][:120]})") from None


def _read_rows(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """The run's rows. cells.jsonl is the source of truth: when it is there the rows come from it, and
    results.csv (derived from it) is cross-checked — a truncated or stale results.csv is said, not trusted."""
    import pandas as pd

    csv_path, jsonl_path = run_dir / RESULTS, run_dir / CELLS
    if jsonl_path.is_file():
        rows = read_records(run_dir)
        df = pd.DataFrame(rows, columns=None if rows else list(RESULT_COLUMNS)).drop(
            columns=["step_times_ms", "cell", "allreduce_sweep"], errors="ignore")
        if not csv_path.is_file():
            return df, ["results.csv is missing; rows were read from cells.jsonl (the run may be "
                        "incomplete)."]
        try:
            csv_ids = list(_read_csv(csv_path)["cell_id"]) if csv_path.stat().st_size else []
        except (RunError, KeyError) as e:
            return df, [f"results.csv cannot be read ({e}); rows were rebuilt from cells.jsonl."]
        jsonl_ids = [r["cell_id"] for r in rows]
        if csv_ids != jsonl_ids:
            missing = len(set(jsonl_ids) - set(csv_ids))
            return df, [f"results.csv disagrees with cells.jsonl (the source of truth): {len(csv_ids)} rows "
                        f"against {len(jsonl_ids)} cells, {missing} missing from it (truncated or stale?); "
                        "the report uses cells.jsonl."]
        return df, []
    if csv_path.is_file():
        return _read_csv(csv_path), ["cells.jsonl is missing; rows were read from results.csv."]
    raise RunError(
        f"{run_dir}: neither results.csv nor cells.jsonl found (is this a results/<run-id>/ folder?)"
    )


def normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Typed columns in RESULT_COLUMNS order (extra runner columns kept after them)."""
    import pandas as pd

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
            infinite = values.abs() == float("inf")  # the writer never writes one: an edited or foreign file
            if infinite.any():
                cells = list(df.loc[infinite, "cell_id"])[:3] if "cell_id" in df else []
                raise RunError(f"{source}: column {col!r} holds {values[infinite].iloc[0]} in "
                               f"{int(infinite.sum())} rows (e.g. {cells}); a value not measured is empty, "
                               "never inf")
            df[col] = values.astype(float)
    unknown = sorted(set(df["status"]) - set(STATUSES))
    if unknown:
        raise RunError(f"{source}: unknown status {unknown}; expected one of {STATUSES}")
    df["comm_dtype"] = _comm_dtypes(df, source)
    extras = [c for c in df.columns if c not in RESULT_COLUMNS]
    return df[list(RESULT_COLUMNS) + extras].reset_index(drop=True)


def _comm_dtypes(df: pd.DataFrame, source: str) -> pd.Series:
    """The rows' comm_dtype in the runner's words: a config alias ("fp32") becomes the value it stands for
    ("none"), so every table sees one spelling of "no compression". An empty comm_dtype says nothing about
    how the gradients travelled: it is refused rather than guessed."""
    empty = df["comm_dtype"] == ""
    if empty.any():
        cells = list(df.loc[empty, "cell_id"])[:3]
        raise RunError(
            f"{source}: column 'comm_dtype' is empty in {int(empty.sum())} rows (e.g. {cells}); expected one "
            f"of {COMM_DTYPES} or an alias of one {COMM_DTYPE_ALIASES}"
        )
    return df["comm_dtype"].replace(COMM_DTYPE_ALIASES)


def load_run(run_dir: Path | str) -> Run:
    """Load results, env.json and config.toml of `run_dir`; env and config may be absent (noted)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such run folder")
    raw, notes = _read_rows(run_dir)
    results = normalise(raw, str(run_dir))
    env, config = {}, {}
    if (run_dir / ENV).is_file():
        try:
            env = json.loads((run_dir / ENV).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{run_dir / ENV}: not valid JSON ({e})") from None
        if not isinstance(env, dict):
            raise RunError(f"{run_dir / ENV}: not a JSON object")
    else:
        notes.append("env.json is missing: the environment fingerprint is unknown.")
    if (run_dir / CONFIG).is_file():
        try:
            config = tomllib.loads((run_dir / CONFIG).read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{run_dir / CONFIG}: not valid TOML ({e})") from None
    else:
        notes.append("config.toml is missing: the resolved preset is unknown.")
    return Run(path=run_dir, results=results, env=env, config=config, notes=notes)
