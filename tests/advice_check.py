"""A second witness of the advice's words: no row of advice.csv and no sentence of advice.md says what its
interval does not (issue 46). Written apart from bench/advise (its own Holm step-down, its own reading of the
words), and run by tests/conftest.py over every advice/ folder a test leaves behind, so every end-to-end run
of the suite is checked, whatever it was written for.

The words checked, against the speedup's 95 % interval [low, high] and whether its p survives Holm's
correction over the file's rows with a p:
- `verdict_vs_baseline`: faster / slower (excludes 1, survives), "… before correction" (excludes 1, does
  not survive), within noise (holds 1);
- `why`: it ends with that verdict in words, says "beyond the noise" only of a faster/slower row and
  "within noise" only of one whose interval holds 1;
- the roles: `use` only for a faster row, with a baseline measured beside it at its precision; `keep` and
  `unclear` only when no row of the precision is faster; a `contender` below 1 only when every other is;
- advice.md's answer: "Use" only with a baseline line; every "S× [low, high]" it prints is followed by words
  its interval allows, and one below 1 is called slower, never the best or closest candidate.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

SPEEDUP = re.compile(r"(\d+\.\d\d)× \[(\d+\.\d\d), (\d+\.\d\d)\]")


def holm_survivors(p_values: list[float]) -> list[bool]:
    """Holm's step-down at 0.05: p_(j) (ascending, j from 0) is rejected while p_(i) ≤ 0.05 / (m − i) for
    every i ≤ j."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > 0.05 / (m - rank):
            break
        out[i] = True
    return out


def expected_verdicts(table: pd.DataFrame) -> dict:
    """index → the verdict the row's interval and corrected p allow ("" without an interval)."""
    has = table["speedup_vs_baseline_ci95_low"].notna() & table["speedup_vs_baseline_ci95_high"].notna() \
        & table["speedup_p"].notna() & ~table["baseline"].astype(bool)
    tested = table[has]
    survives = dict(zip(tested.index, holm_survivors([float(p) for p in tested["speedup_p"]])))
    out = {}
    for i, r in table.iterrows():
        low, high = r["speedup_vs_baseline_ci95_low"], r["speedup_vs_baseline_ci95_high"]
        if r["baseline"] or pd.isna(low) or pd.isna(high):
            out[i] = ""
            continue
        raw = "faster" if low > 1 else "slower" if high < 1 else "within noise"
        if raw != "within noise" and not survives.get(i, False):
            raw += " before correction"
        out[i] = raw
    return out


def _words_allowed(text: str, low: float, high: float) -> str | None:
    """What is wrong with `text` (the words after an interval) for [low, high] as printed (2 decimals: each
    bound within 0.005 of the measured one, given the benefit of that doubt), or None."""
    r = 0.005
    if "faster beyond the noise" in text and not low + r > 1:
        return "says faster beyond the noise"
    if "slower beyond the noise" in text and not high - r < 1:
        return "says slower beyond the noise"
    if "before correction" in text and low + r <= 1 <= high - r:
        return "says before correction of an interval holding 1"
    if "within noise" in text and not low - r <= 1 <= high + r:
        return "says within noise of an interval that excludes 1"
    return None


def contradictions(folder: Path) -> list[str]:
    """Every place where advice.csv or advice.md in `folder` says what its numbers do not."""
    csv, md = folder / "advice.csv", folder / "advice.md"
    table = pd.read_csv(csv)
    if "verdict_vs_baseline" not in table.columns or "answer_role" not in table.columns:
        return []
    for column in ("verdict_vs_baseline", "answer_role", "why"):
        table[column] = [v if isinstance(v, str) else "" for v in table[column]]
    table["baseline"] = table["baseline"].fillna(False).astype(bool)
    found = []
    want = expected_verdicts(table)
    ranked = table[table["rank"].notna()]
    for i, r in ranked.iterrows():
        cell = r["cell_id"]
        if r["verdict_vs_baseline"] != want[i]:
            found.append(f"{cell}: verdict {r['verdict_vs_baseline']!r}, its interval and p say {want[i]!r}")
        if "beyond the noise" in r["why"] and want[i] not in ("faster", "slower"):
            found.append(f"{cell}: why says beyond the noise, the verdict is {want[i]!r}: {r['why']}")
        if "within noise" in r["why"] and want[i] not in ("within noise", ""):
            found.append(f"{cell}: why says within noise, the verdict is {want[i]!r}: {r['why']}")
        if want[i] and want[i] not in r["why"]:
            found.append(f"{cell}: why does not say {want[i]!r}: {r['why']}")
        if r["answer_role"] == "use" and want[i] != "faster":
            found.append(f"{cell}: answer_role use, verdict {want[i]!r}")
    named = table[table["answer_role"].isin(["use", "keep", "unclear", "best"])]
    if len(named) != 1:
        return found + [f"{len(named)} rows with a named answer_role"]
    named = named.iloc[0]
    here = ranked[ranked["precision"] == named["precision"]]
    faster = [i for i in here.index if want[i] == "faster"]
    base = here[here["baseline"]]
    if named["answer_role"] in ("keep", "unclear") and faster:
        found.append(f"answer keeps the baseline while {here.loc[faster[0], 'cell_id']} is faster")
    if named["answer_role"] == "use" and base.empty:
        found.append("answer_role use without a baseline at its precision")
    others = here[~here["baseline"]]
    not_below = [i for i in others.index if not others.loc[i, "speedup_vs_baseline_ci95_high"] < 1]
    contender = here[here["answer_role"] == "contender"]
    if len(contender) and not_below and contender.index[0] not in not_below:
        found.append(f"contender {contender.iloc[0]['cell_id']} lies below 1 while "
                     f"{others.loc[not_below[0], 'cell_id']} does not")
    if md.is_file():
        found += _sentence(md.read_text(), named, base)
    return found


def _sentence(md: str, named: pd.Series, base: pd.DataFrame) -> list[str]:
    """advice.md's answer (its verdict and "- " lines, before the caveats) against the rows."""
    body = [line for line in md.splitlines() if line.strip() and not line.startswith("# ")]
    answer = [body[0]] + [line[2:] for line in body[1:] if line.startswith("- ")][:20]
    found = []
    if answer[0].startswith("Use") and (base.empty or not any(a.startswith("baseline: ") for a in answer)):
        found.append(f"answer says Use without a baseline measured beside it: {answer[0]}")
    if answer[0].startswith("Use") and named["answer_role"] != "use":
        found.append(f"answer says Use, answer_role is {named['answer_role']}")
    for line in answer:
        for m in SPEEDUP.finditer(line):
            low, high = float(m.group(2)), float(m.group(3))
            after = line[m.end():].split(";")[0]
            wrong = _words_allowed(after, low, high)
            if wrong:
                found.append(f"{wrong} of {m.group(0)}: {line}")
            before = line[:m.start()]
            if high + 0.005 < 1 and (line.startswith("Use") or ("best" in before and "below" not in before)):
                found.append(f"an interval below 1 is called the best or advised: {line}")
            if high + 0.005 < 1 and "slower" not in line:
                found.append(f"an interval below 1 is not called slower: {line}")
    if math.isnan(float(named.get("samples_per_s", float("nan")))):
        found.append("the named row has no throughput")
    return found


def check_tree(root: Path, seen: set | None = None) -> list[str]:
    """contradictions() of every advice/ folder under `root` (each once per session: `seen`)."""
    found = []
    for csv in sorted(Path(root).rglob("advice.csv")):
        if csv.parent.name != "advice" and not (csv.parent / "advice.md").is_file():
            continue  # a report's copy (tables/advice.csv) is checked where it was written
        key = (csv, csv.stat().st_mtime_ns)
        if seen is not None:
            if key in seen:
                continue
            seen.add(key)
        found += [f"{csv.parent}: {f}" for f in contradictions(csv.parent)]
    return found
