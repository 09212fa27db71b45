"""Headline findings: sentences written from the tables' numbers, never from assumptions."""

from __future__ import annotations

import pandas as pd

from bench import engines, schema, stats
from bench.nvidia import topology_has_nvlink
from bench.project.collectives import allreduce_cost
from bench.project.network import FABRICS, preset_network
from bench.report import slices, tables

# An all-reduce busbw below this fraction of the NVLink preset's figure (bench/project/network.py) for the
# same message size and rank count is "far below": a lost P2P path costs several-fold, noise does not.
BUSBW_FLOOR_FRACTION = 0.25
# The NVLink presets by GPU name (the presets are 8-GPU NVSwitch systems' nccl-tests figures).
NVLINK_PRESETS = (("H100", "h100-nvlink"), ("H200", "h100-nvlink"), ("A100", "a100-nvlink"))
SLURM_HINT = ("Under SLURM, `--gpus-per-task=1` puts each rank in a cgroup that sees only its own GPU, so "
              "NCCL cannot map its peers' memory and falls back to host memory or the network: launch with "
              "`--gpu-bind=none` or `--gpus-per-node` (docs/running.md, SLURM).")


def _setting(r) -> str:
    parts = [str(r["precision"])]
    if r.get("comm_dtype") != "none":
        parts.append(f"{r['comm_dtype']} gradients")
    if pd.notna(r.get("bucket_cap_mb")):
        parts.append(f"{r['bucket_cap_mb']:g} MiB buckets")
    if r.get("grad_accum", 1) != 1:
        parts.append(f"accumulation {int(r['grad_accum'])}")
    return ", ".join(parts)


def _has(df: pd.DataFrame, *columns: str) -> bool:
    return all(c in df.columns and df[c].notna().any() for c in columns)


def against_torch_words(r) -> str:
    """One engine against torch DDP in words that respect the verdict: "faster by x % (95 % CI a–b %)"
    only when the whole interval of speed_vs_torch is above 1, "slower …" only when below, else
    "within noise (±x %)" (bench.stats.verdict). With `_verdict` (the run's verdict after Holm's
    correction, tables.family_verdicts), a difference that does not survive it is "within noise" too."""
    ratio, low, high = r["speed_vs_torch"], r["speed_vs_torch_ci95_low"], r["speed_vs_torch_ci95_high"]
    verdict = stats.verdict(low, high)
    family = r.get("_verdict", verdict)
    if verdict != family:
        return (f"within noise once corrected for the run's comparisons (uncorrected 95 % CI "
                f"{(low - 1) * 100:+.1f} to {(high - 1) * 100:+.1f} %)")
    if verdict == "faster":
        return f"faster by {(ratio - 1) * 100:.1f} % (95 % CI {(low - 1) * 100:.1f}–{(high - 1) * 100:.1f} %)"
    if verdict == "slower":
        return f"slower by {(1 - ratio) * 100:.1f} % (95 % CI {(1 - high) * 100:.1f}–{(1 - low) * 100:.1f} %)"
    return f"within noise (±{max(abs(low - 1), abs(high - 1)) * 100:.1f} %)"


def family_of_verdicts(df: pd.DataFrame) -> list[str]:
    """How many faster/slower verdicts chance alone would give at the run's number of comparisons against
    torch DDP (each at 95 %: 5 % of them if every engine equalled torch), and how many survive Holm's
    correction (tables.family_verdicts)."""
    if not _has(df, "speed_vs_torch_ci95_low", "speed_vs_torch_ci95_high"):
        return []
    ok = df[(df["status"] == "ok") & df["speed_vs_torch_ci95_low"].notna()]
    if not len(ok):
        return []
    m = len(ok)
    raw = [stats.verdict(lo, hi)
           for lo, hi in zip(ok["speed_vs_torch_ci95_low"], ok["speed_vs_torch_ci95_high"])]
    n_raw = sum(v in ("faster", "slower") for v in raw)
    chance = f"{m * (1 - stats.CONFIDENCE):.1f}"
    lead = (f"The run compares {m} cells with torch DDP; if every engine equalled torch, chance alone would "
            f"still give about {chance} faster/slower verdicts at 95 % each. ")
    if not _has(df, "speed_vs_torch_p"):
        return [lead + f"{n_raw} of the {m} are faster or slower, uncorrected (these results have no "
                       "p-values for Holm's correction): read them as possibly chance."]
    kept = sum(v in ("faster", "slower") for v in tables.family_verdicts(ok))
    return [lead + f"Holm's correction (family-wise error ≤ 5 %) keeps {kept} of the {n_raw} uncorrected "
                   "verdicts; the others are worded within noise."]


def separable_fastest(at_n: pd.DataFrame):
    """The engine whose step-time interval lies wholly below every other engine's, or None: "fastest"
    is said only when the intervals separate it from the rest."""
    if len(at_n) < 2 or not _has(at_n, "step_time_ms_ci95_low", "step_time_ms_ci95_high"):
        return None
    best = at_n.loc[at_n["step_time_ms_p50"].idxmin()]
    others = at_n.drop(index=best.name)
    return best if (best["step_time_ms_ci95_high"] < others["step_time_ms_ci95_low"]).all() else None


def _lead(at_n: pd.DataFrame, paired: pd.DataFrame) -> str:
    """The lead of a world size's sentence, from the same verdicts against torch that follow it: "fastest"
    only when the step-time intervals separate one engine from all others, and never "no engine is faster"
    when a verdict that follows says faster."""
    best = separable_fastest(at_n)
    if best is not None:
        return (f"{best['engine']} is fastest ({best['_thr']:,.0f} samples/s, its step-time interval below "
                f"every other engine's)")
    raw = [stats.verdict(r["speed_vs_torch_ci95_low"], r["speed_vs_torch_ci95_high"])
           for _, r in paired.iterrows()]
    # the corrected verdict leads (tables.family_verdicts, `_verdict`); the uncorrected one only follows it
    corrected = [r.get("_verdict", v) for (_, r), v in zip(paired.iterrows(), raw)]
    faster = [e for e, v in zip(paired["engine"], corrected) if v == "faster"]
    if not faster:
        before = [e for e, v in zip(paired["engine"], raw) if v == "faster"]
        if before:
            return (f"no engine is faster than torch DDP once corrected for the run's comparisons "
                    f"({_names(before)} {'are' if len(before) > 1 else 'is'} before the correction)")
        return "no engine is fastest beyond the noise (step-time intervals overlap)"
    are = "are" if len(faster) > 1 else "is"
    return (f"{_names(faster)} {are} faster than torch DDP beyond the noise, yet no engine is fastest (the "
            f"step-time intervals of the quickest overlap)")


def _names(engines: list[str]) -> str:
    return " and ".join([", ".join(engines[:-1]), engines[-1]] if len(engines) > 1 else engines)


def engines_per_world_size(df: pd.DataFrame) -> list[str]:
    """At each world size of the main setting, every engine against torch DDP measured side by side
    (speed_vs_torch with its interval), and the fastest engine only when the intervals separate it.
    Runs without intervals (older result files) get the medians, said to carry no interval."""
    df = df.assign(_verdict=tables.family_verdicts(df))  # the whole run is the family, not the slice
    main = slices.main_slice(df)
    ok = main[main["status"] == "ok"].copy()
    if not len(ok):
        return []
    ok["_thr"] = tables.throughputs(ok)
    out = []
    for n in tables.world_sizes(ok):
        at_n = ok[ok["world_size"] == n].dropna(subset=["_thr"])
        if not len(at_n):
            continue
        rank_word = "rank" if n == 1 else "ranks"
        if at_n["engine"].nunique() == 1:
            r = at_n.iloc[0]
            out.append(f"At {n} {rank_word}, {r['engine']} (the only engine measured) runs {r['_thr']:,.0f} "
                       f"samples/s (p50 step {r['step_time_ms_p50']:.2f} ms) [{_setting(r)}].")
            continue
        paired = at_n[at_n["engine"] != engines.reference().name]
        if "speed_vs_torch_ci95_low" in paired:
            paired = paired[paired["speed_vs_torch_ci95_low"].notna()]
        if len(paired) and "speed_vs_torch_ci95_low" in paired:
            words = "; ".join(f"{r['engine']} {against_torch_words(r)}" for _, r in paired.iterrows())
            lead = _lead(at_n, paired)
            out.append(f"At {n} {rank_word}, {lead}. Against torch DDP, measured side by side: {words} "
                       f"[{_setting(paired.iloc[0])}].")
            continue
        best = at_n.loc[at_n["_thr"].idxmax()]
        out.append(f"At {n} {rank_word}, {best['engine']} has the highest median throughput, "
                   f"{best['_thr']:,.0f} samples/s (p50 step {best['step_time_ms_p50']:.2f} ms); no interval "
                   f"was measured, so this may be noise [{_setting(best)}].")
    return out


def unstable_cells(df: pd.DataFrame) -> list[str]:
    """Cells whose step-time interval is wider than ±UNSTABLE_HALF_WIDTH_PCT of the median: shown, but
    their comparisons are not to be trusted until rerun with more steps."""
    if not _has(df, "step_time_ms_ci95_low", "step_time_ms_ci95_high"):
        return []
    ok = df[df["status"] == "ok"]
    width = tables.half_width_pct(ok)
    bad = ok[width > stats.UNSTABLE_HALF_WIDTH_PCT]
    if not len(bad):
        return []
    named = ", ".join(bad["cell_id"].head(5)) + (", …" if len(bad) > 5 else "")
    return [f"{len(bad)} of {len(ok)} cells are unstable (95 % interval of the median step time wider than "
            f"±{stats.UNSTABLE_HALF_WIDTH_PCT:g} %): {named}. Rerun them with more run.timed_steps before "
            f"trusting a comparison that involves them."]


def launch_noise(df: pd.DataFrame) -> list[str]:
    """What the intervals hold of the noise between launches (run.launches): the launches per cell and how
    far their medians spread, or that it is unknown with one launch (bench/run/between.py)."""
    ok = df[df["status"] == "ok"]
    if not len(ok) or not _has(ok, "step_time_ms_ci95_low"):
        return []
    launches = ok["launches"] if "launches" in ok else pd.Series(float("nan"), index=ok.index)
    several = ok[launches.fillna(1) > 1]
    if not len(several):
        return ["Each cell was timed in one launch (run.launches = 1), so the variance between launches is "
                "unknown: the intervals hold only the noise within a launch, and a second run of the same "
                "code can differ by more (bench compare says so; run.launches ≥ 2 measures it)."]
    cv = several["between_launch_cv_pct"].dropna()
    spread = (f"their medians spread by {cv.median():.1f} % at the median cell (between_launch_cv_pct; "
              f"{cv.max():.1f} % at most)" if len(cv) else "no spread was measured")
    return [f"{len(several)} of {len(ok)} cells were timed in {several['launches'].median():.0f} launches, "
            f"in an order shuffled with the seed; {spread}. Their intervals hold that variance "
            f"(docs/measurement.md, \"Between launches\")."]


def warmup_and_outliers(df: pd.DataFrame) -> list[str]:
    """Cells whose warm-up the changepoint test found running past run.warmup_steps (their first rounds
    left out), and the steps outside Tukey's fences, counted and kept (bench/worker/steady.py)."""
    ok = df[(df["status"] == "ok")]
    out = []
    if _has(ok, "warmup_steps_detected"):
        found = ok[ok["warmup_steps_detected"].fillna(0) > 0]
        if len(found):
            longest = found.loc[found["warmup_steps_detected"].idxmax()]
            steps = int(longest["warmup_steps_detected"])
            out.append(f"The warm-up test (a changepoint in the step times) found a slower start in "
                       f"{len(found)} of {len(ok)} cells, the longest {steps} steps ({longest['cell_id']}); "
                       f"each cell's measurement starts after it, or after run.warmup_steps when that is "
                       f"later (warmup_steps_detected).")
    if _has(ok, "outlier_steps"):
        counted = ok["outlier_steps"].dropna()
        if len(counted) and counted.sum():
            worst = ok.loc[counted.idxmax()]
            out.append(f"{int(counted.sum())} timed steps in {int((counted > 0).sum())} cells lie outside "
                       f"Tukey's fences (1.5 interquartile ranges beyond the quartiles; at most "
                       f"{int(worst['outlier_steps'])} in {worst['cell_id']}): counted, and kept in every "
                       f"median and interval.")
    return out


def skipped_optimizer_steps(df: pd.DataFrame) -> list[str]:
    """fp16 cells whose GradScaler skipped an optimizer step inside the timed window: those steps did no
    update (inf/NaN gradients), so the cell's step time is not a training step's."""
    if not _has(df, "skipped_timed_steps"):
        return []
    bad = df[(df["status"] == "ok") & (df["skipped_timed_steps"].fillna(0) > 0)]
    if not len(bad):
        return []
    named = ", ".join(f"{r['cell_id']} ({int(r['skipped_timed_steps'])})" for _, r in bad.head(5).iterrows())
    return [f"{len(bad)} fp16 cell{'s' if len(bad) > 1 else ''} skipped optimizer steps inside the timed "
            f"window (gradients overflowed; GradScaler skipped the update and halved the scale): {named}"
            f"{', …' if len(bad) > 5 else ''}. Their step times include steps without an optimizer update."]


def efficiency_drops(df: pd.DataFrame, scaling_tables: dict[str, pd.DataFrame]) -> list[str]:
    """Where efficiency first falls below the threshold, and what dominates the loss there.

    One sentence per engine in the run's reference slice (`slices.main_slice`, the same cells the plots
    show), then one sentence counting the configurations outside it, so a large sweep stays readable.
    The loss is the step time above ideal (T₁/N strong, T₁ weak); exposed communication is the part of it
    that synchronising gradients adds, the rest is compute that did not shrink with more ranks.
    """
    exposed_by_cell = dict(zip(df["cell_id"], tables.exposed_comms(df)))
    in_slice = set(slices.main_slice(df)["cell_id"])
    out, others, others_comm = [], 0, 0
    for scaling, table in scaling_tables.items():
        if "efficiency_pct" not in table or not len(table):
            continue
        low = table[table["efficiency_pct"] < tables.EFFICIENCY_THRESHOLD_PCT]
        if not len(low):
            continue
        low = low.assign(_g=tables.config_key(low, tables.scaling_keys(scaling)))
        for _, first in low.groupby("_g", sort=False).head(1).iterrows():
            n, t_n, t_1 = int(first["world_size"]), first["step_time_ms_p50"], first["t1_step_time_ms"]
            loss = t_n - (t_1 / n if scaling == "strong" else t_1)
            exposed = exposed_by_cell[first["cell_id"]]
            comm_dominates = pd.notna(exposed) and loss > 0 and exposed >= loss / 2
            if first["cell_id"] not in in_slice:
                others, others_comm = others + 1, others_comm + comm_dominates
                continue
            out.append(_drop_sentence(first, scaling, loss, exposed))
    if others:
        out.append(
            f"{'Besides these, ' if out else ''}{others} other configuration{'s' if others > 1 else ''} "
            f"fall{'' if others > 1 else 's'} below {tables.EFFICIENCY_THRESHOLD_PCT:.0f} %; exposed "
            f"communication dominates the loss in {others_comm} of them (see the scaling tables)."
        )
    if not out and any(
        "efficiency_pct" in t and t["efficiency_pct"].notna().any() for t in scaling_tables.values()
    ):
        out.append(
            f"Every measured configuration keeps at least {tables.EFFICIENCY_THRESHOLD_PCT:.0f} % "
            f"scaling efficiency."
        )
    return out


def _drop_sentence(first: pd.Series, scaling: str, loss: float, exposed: float) -> str:
    """One configuration's first scaling-table row below the threshold and the ms it lost, split the same
    way for every configuration: exposed communication (the breakdown column, at most the loss) and the rest,
    compute that did not shrink with more ranks; the larger part is said to dominate."""
    t_n = first["step_time_ms_p50"]
    s = (
        f"{first['engine']} ({scaling}, {_setting(first)}) falls to {first['efficiency_pct']:.1f} % "
        f"efficiency at {int(first['world_size'])} ranks: p50 step {t_n:.2f} ms against an ideal "
        f"{t_n - loss:.2f} ms"
    )
    if pd.isna(exposed):
        return s + "; compute-only time was not measured, so what dominates is unknown."
    comm = min(max(exposed, 0.0), max(loss, 0.0))
    rest = max(loss, 0.0) - comm
    dominant = "exposed communication" if comm >= rest else "compute that did not shrink"
    return s + (
        f"; of the {loss:.2f} ms lost, exposed communication is {comm:.2f} ms ({exposed / t_n * 100:.0f} % "
        f"of the step) and compute that did not shrink {rest:.2f} ms: {dominant} dominates."
    )


def nvlink_preset(gpu_name: str) -> str | None:
    """The NVLink preset (bench/project/network.py) for a GPU name, or None."""
    return next((preset for key, preset in NVLINK_PRESETS if key in str(gpu_name)), None)


def expected_busbw_gbps(preset: str, size_bytes: float, n: int) -> float:
    """The busbw nccl-tests would report for one all-reduce of `size_bytes` on n ranks of the preset's node:
    algbw = S / t with t the projection's cost (latency included), busbw = algbw · 2(n−1)/n."""
    t_us = allreduce_cost(preset_network(preset, gpus_per_node=max(n, 8)), size_bytes, n).total_us
    return size_bytes / (t_us * 1e3) * 2 * (n - 1) / n


def transport_warnings(df: pd.DataFrame, env: dict | None) -> list[str]:
    """Per world size on one node whose `nvidia-smi topo -m` shows NVLink: NCCL connected the GPUs through
    host memory (SHM) or the network (NET), or the probe's all-reduce busbw is below BUSBW_FLOOR_FRACTION of
    the NVLink preset's figure. Said with the transport, the measured and the expected bandwidth."""
    env = env or {}
    if not len(df) or "nccl_transport" not in df or not topology_has_nvlink(env.get("topology")):
        return []
    gpus = env.get("gpu_count") or 0
    ok = df[(df["status"] == "ok") & (df["world_size"] > 1) & (df["world_size"] <= gpus)]
    out = []
    for n, at_n in ok.groupby("world_size", sort=True):
        transports = sorted({t for t in at_n["nccl_transport"] if t})
        slow_path = [t for t in transports if any(p.split("/")[0] in ("SHM", "NET") for p in t.split("+"))]
        measured = at_n.dropna(subset=["allreduce_busbw_gbps", "allreduce_bytes"])
        best = measured.loc[measured["allreduce_busbw_gbps"].idxmax()] if len(measured) else None
        preset = nvlink_preset(best["gpu_name"]) if best is not None and "gpu_name" in best else None
        expected = (expected_busbw_gbps(preset, float(best["allreduce_bytes"]), int(n))
                    if preset in FABRICS else None)
        bw = "" if best is None else (
            f"; all-reduce bus bandwidth {best['allreduce_busbw_gbps']:.1f} GB/s at "
            f"{best['allreduce_bytes'] / 2**20:.1f} MiB"
            + (f" against ≈{expected:.0f} GB/s for the {preset} preset" if expected else ""))
        if slow_path:
            out.append(f"At {int(n)} ranks NCCL connected the GPUs via {', '.join(slow_path)} although "
                       f"`nvidia-smi topo -m` shows NVLink between them{bw}. {SLURM_HINT}")
        elif expected and best["allreduce_busbw_gbps"] < BUSBW_FLOOR_FRACTION * expected:
            via = f" (NCCL transport {', '.join(transports) or 'not recorded'})"
            out.append(f"At {int(n)} ranks the all-reduce bus bandwidth is far below the NVLink node's{via}"
                       f"{bw}, under {BUSBW_FLOOR_FRACTION:.0%} of it. {SLURM_HINT}")
    return out


def race_summary(df: pd.DataFrame, search: str) -> list[str]:
    """A racing search (run.search): how many configurations it eliminated, at which world size and after
    how many rounds, and how many were not launched at all; nothing for a grid run."""
    out = df[df["status"] == "raced_out"]
    if not schema.search(search).races and not len(out):
        return []
    launched = out[out["race_round"].notna() & ~out["error"].str.startswith("not launched")]
    parts = []
    for ws, rows in launched.groupby("world_size"):
        rounds = ", ".join(f"{n} after {int(r)} rounds" for r, n in rows["race_round"].value_counts()
                           .sort_index().items())
        parts.append(f"at world size {int(ws)}: {rounds}")
    skipped = len(out) - len(launched)
    text = (f"The run was raced (run.search = {search}): {len(out)} of {len(df)} cells were eliminated "
            f"(raced_out){': ' + '; '.join(parts) if parts else ''}")
    if skipped:
        text += (f"; {skipped} not launched, their configuration raced out at a smaller world size in every "
                 "recipe")
    return [text + '. They are listed under "Raced out"; their rows hold their rounds so far, and the '
            "advice ranks the survivors only."]


def status_summary(df: pd.DataFrame) -> list[str]:
    """How many cells produced no numbers, by status (a race's raced_out cells: race_summary)."""
    bad = df[~df["status"].isin(("ok", "raced_out"))]
    if not len(bad):
        done = df[df["status"] == "ok"]
        return [f"All {len(done)} cells {'that were not raced out ' if len(done) < len(df) else ''}finished "
                "with status ok."]
    counts = ", ".join(f"{n} {s}" for s, n in bad["status"].value_counts().sort_index().items())
    return [
        f"{len(bad)} of {len(df)} cells produced no numbers ({counts}); they are listed with their "
        f'reasons under "Cells without numbers".'
    ]


def headline(df: pd.DataFrame, scaling_tables: dict[str, pd.DataFrame], env: dict | None = None,
             search: str = "grid") -> list[str]:
    """All headline sentences, in reading order (`env`: env.json, for the transport warnings; `search`:
    the run's run.search)."""
    if not len(df):
        return [
            "The run has no cells yet: results.csv has no rows (did the runner stop before the first cell?)."
        ]
    sentences = (engines_per_world_size(df) + family_of_verdicts(df) + transport_warnings(df, env)
                 + efficiency_drops(df, scaling_tables) + unstable_cells(df) + launch_noise(df)
                 + warmup_and_outliers(df) + skipped_optimizer_steps(df))
    why = tables.efficiency_unavailable(df)
    return sentences + ([why] if why else []) + race_summary(df, search) + status_summary(df)
