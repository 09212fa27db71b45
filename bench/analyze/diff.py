"""Why did B differ from A: two runs' traces of the same configuration, side by side (pure functions of
trace_summary.csv and kernel_classes.csv; definitions: docs/analysis.md).

- profile: per configuration, the mean profiled step of one run (step, compute, exposed communication,
  memory, idle, host; ms per step per rank) and its time per kernel class (ms per step per rank).
- part_diff / class_diff: A and B side by side, change = B − A, ratio = B / A.
- sentence: "B is 1.90× faster than A per profiled step (…); GEMM time fell 2.40× (…), …" from those.
"""

from __future__ import annotations

import pandas as pd

from bench.analyze.tables import _per_step

ALL_TRACES = "all traces"  # the configuration of traces outside a run (no results.csv to say which)

# The step's parts: trace_summary columns, host = CPU Exec time (cpu_exec_pct of the host window).
PARTS = ("step_ms", "compute_ms", "exposed_comm_ms", "memory_ms", "idle_ms", "host_ms")
PART_WORDS = {"step_ms": "step", "compute_ms": "compute", "exposed_comm_ms": "exposed communication",
              "memory_ms": "memory", "idle_ms": "idle", "host_ms": "host (CPU exec)"}


def _config(frame: pd.DataFrame, config_of: dict[str, str] | None) -> pd.Series:
    if config_of is None:
        return pd.Series(ALL_TRACES, index=frame.index)
    return frame["cell_id"].astype(str).map(config_of)


def profile(summary: pd.DataFrame, classes: pd.DataFrame,
            config_of: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(parts, classes) per configuration of one run. config_of maps cell_id → configuration (None: every
    file is one configuration, ALL_TRACES). parts: the mean over profiled-step rows (every step of every
    rank; a file without steps gives its whole window) of each PART; step_ms = the host window
    (ProfilerStep length), host_ms = cpu_exec_pct × window / 100. classes: Σ time_ms over the files of the
    configuration / Σ their profiled steps (a file without steps counts as one)."""
    steps = _per_step(summary)
    steps = steps.assign(config=_config(steps, config_of),
                         step_ms=steps["window_ms"],
                         host_ms=steps["cpu_exec_pct"] * steps["window_ms"] / 100)
    grouped = steps.groupby("config")
    parts = grouped[list(PARTS)].mean()
    parts["n_rows"] = grouped.size()
    per_file = classes.drop_duplicates("trace_file").assign(steps=lambda f: f["n_steps"].clip(lower=1))
    per_file = per_file.assign(config=_config(per_file, config_of))
    n_steps = per_file.groupby("config")["steps"].sum()
    cls = classes.assign(config=_config(classes, config_of))
    cls = cls.groupby(["config", "kernel_class"])["time_ms"].sum()
    cls = (cls / n_steps.reindex(cls.index.get_level_values("config")).to_numpy()).rename("ms_per_step")
    return parts.reset_index(), cls.reset_index()


def _side_by_side(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """a and b (column `ms`) joined on keys: a_ms, b_ms, change_ms = b − a, ratio_b_over_a = b / a."""
    out = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"))
    out = out.rename(columns={"ms_a": "a_ms", "ms_b": "b_ms"})
    out["change_ms"] = out["b_ms"] - out["a_ms"]
    out["ratio_b_over_a"] = (out["b_ms"] / out["a_ms"]).where(out["a_ms"] > 0)
    return out


def part_diff(parts_a: pd.DataFrame, parts_b: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration on both sides, part): a_ms, b_ms, change_ms, ratio_b_over_a."""
    both = sorted(set(parts_a["config"]) & set(parts_b["config"]))
    long = lambda p: p[p["config"].isin(both)].melt("config", list(PARTS), "part", "ms")  # noqa: E731
    out = _side_by_side(long(parts_a), long(parts_b), ["config", "part"])
    order = {p: i for i, p in enumerate(PARTS)}
    return out.sort_values(["config", "part"], key=lambda s: s.map(order) if s.name == "part" else s,
                           ignore_index=True)


def class_diff(classes_a: pd.DataFrame, classes_b: pd.DataFrame) -> pd.DataFrame:
    """One row per (configuration on both sides, kernel class), largest |change| first; a class absent on
    one side is 0 ms there (no such kernel ran)."""
    both = set(classes_a["config"]) & set(classes_b["config"])
    pick = lambda c: c[c["config"].isin(both)].rename(columns={"ms_per_step": "ms"})  # noqa: E731
    out = _side_by_side(pick(classes_a), pick(classes_b), ["config", "kernel_class"])
    out[["a_ms", "b_ms"]] = out[["a_ms", "b_ms"]].fillna(0.0)
    out["change_ms"] = out["b_ms"] - out["a_ms"]
    out["ratio_b_over_a"] = (out["b_ms"] / out["a_ms"]).where(out["a_ms"] > 0)
    out = out.assign(_abs=out["change_ms"].abs()).sort_values(["config", "_abs"], ascending=[True, False])
    return out.drop(columns="_abs").reset_index(drop=True)


def change_words(what: str, a: float, b: float) -> str:
    """'GEMM time fell 2.40× (4.1 → 1.71 ms)': the factor is the larger over the smaller."""
    if a == b:
        return f"{what} unchanged ({a:.3g} ms)"
    if a == 0 or b == 0:
        return f"{what} {'appeared' if a == 0 else 'vanished'} ({a:.3g} → {b:.3g} ms)"
    verb, factor = ("fell", a / b) if b < a else ("rose", b / a)
    return f"{what} {verb} {factor:.2f}× ({a:.3g} → {b:.3g} ms)"


def sentence(config: str, parts: pd.DataFrame, classes: pd.DataFrame, label_a: str, label_b: str,
             top: int = 3) -> str:
    """The configuration's verdict from its part_diff and class_diff rows: speed per profiled step, the
    `top` kernel classes by |change|, and exposed communication."""
    p = parts[parts["config"] == config].set_index("part")
    a, b = p.loc["step_ms", "a_ms"], p.loc["step_ms", "b_ms"]
    if pd.isna(a) or pd.isna(b) or a <= 0 or b <= 0:
        return f"{config}: no profiled step on both sides."
    speed = (f"{label_b} is {a / b:.2f}× faster than {label_a}" if b <= a
             else f"{label_b} is {b / a:.2f}× slower than {label_a}")
    text = f"{config}: {speed} per profiled step ({a:.3g} → {b:.3g} ms)"
    c = classes[(classes["config"] == config) & (classes["change_ms"] != 0)].head(top)
    changes = [change_words(f"{r.kernel_class} time", r.a_ms, r.b_ms) for r in c.itertuples()]
    ea, eb = p.loc["exposed_comm_ms", "a_ms"], p.loc["exposed_comm_ms", "b_ms"]
    if pd.notna(ea) and pd.notna(eb):
        changes.append(change_words("exposed communication", ea, eb))
    return text + ("; " + ", ".join(changes) if changes else "") + "."
