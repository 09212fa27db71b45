"""`bench advise`: one recipe at a time, every configuration against torch DDP's defaults with its interval
(read back from advice.csv and recomputed from results.csv), the headline that keeps the defaults when tied,
names the simplest tied winner, or says there is no clear winner; the projection from the row's own batch;
memory filtering; what did not make it; best.toml planned by `bench run --dry-run`; the exit-2 cases."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from report_fixtures import CPU_ENV, row, write_run

from bench.__main__ import main
from bench.run_folder import load_run

BUCKETS = [4 * 2**20, 2**20]  # bytes on the wire per bucket, as a cell records them (bucket_sizes_bytes)
TESTS = Path(__file__).parent


def _cell(engine, ws, step, low, high, *, scaling="strong", grad_accum=1, global_batch=64,
          per_rank_batch=None, paired=None, mem=1000.0, **kw):
    """A result row with a real-format cell id, its step-time interval, and (paired: (ratio, low, high, p))
    its speed_vs_torch against the torch cell stepped beside it."""
    r = row(engine, ws, step, peak_mem_mb=mem, compute_only_ms=step * 0.8, scaling=scaling, device="cpu",
            grad_accum=grad_accum, global_batch=global_batch, per_rank_batch=per_rank_batch, **kw)
    bucket = "na" if r["bucket_cap_mb"] == "" else f"{float(r['bucket_cap_mb']):g}"
    r["cell_id"] = (f"{engine}-mlp.tiny-ws{ws}-b{bucket}-{r['precision']}-c{r['comm_dtype']}-ga{grad_accum}"
                    f"-{scaling}-gb{r['global_batch']}")
    r.update(step_time_ms_ci95_low=low, step_time_ms_ci95_high=high, interleaved="true")
    if paired:
        r.update(zip(("speed_vs_torch", "speed_vs_torch_ci95_low", "speed_vs_torch_ci95_high",
                      "speed_vs_torch_p"), paired))
    if ws == 1:  # the base cell: its phases are the projection's compute side
        r.update(forward_ms_p50=step * 0.3, backward_ms_p50=step * 0.6, optimizer_ms_p50=step * 0.1)
    return r


def _rows():
    # Recipe 64 at 2 ranks (4 configurations) and recipe 32 (2): 64 is the most measured, the default.
    # torch strong ga1 (per-GPU 32): 50 ms [49, 51] — the baseline (torch, no options, 25 MiB, ga 1).
    # overlap strong ga1: stepped beside it, its paired ratio 1.10 [1.06, 1.15] p 0.0002.
    # bucketed weak ga2 (per-GPU 16): 40 ms [39, 41], not stepped beside it → 50/40 = 1.25 from both
    #   intervals: down √(ln(50/49)² + ln(41/40)²), up √(ln(51/50)² + ln(40/39)²).
    # torch weak ga2: 49 ms [45, 53] → within noise.
    ones = [_cell(e, 1, 90.0, 89.0, 91.0) for e in ("torch", "overlap")]
    ones += [_cell(e, 1, 45.0, 44.5, 45.5, scaling="weak", grad_accum=2, per_rank_batch=16)
             for e in ("torch", "bucketed")]
    return ones + [
        _cell("torch", 2, 50.0, 49.0, 51.0),
        _cell("overlap", 2, 45.5, 45.0, 46.0, paired=(1.10, 1.06, 1.15, 0.0002)),
        _cell("bucketed", 2, 40.0, 39.0, 41.0, scaling="weak", grad_accum=2, per_rank_batch=16),
        _cell("torch", 2, 49.0, 45.0, 53.0, scaling="weak", grad_accum=2, per_rank_batch=16),
        _cell("torch", 2, 30.0, 29.5, 30.5, global_batch=32),
        _cell("overlap", 2, 29.0, 28.5, 29.5, global_batch=32, paired=(1.03, 1.01, 1.05, 0.01)),
        row("naive", 2, None, bucket_cap_mb=None, status="failed", error="boom", device="cpu"),
    ]


def _write(tmp_path, rows, name="run"):
    run = write_run(tmp_path / name, rows, env={**CPU_ENV})
    records = [json.loads(line) for line in (run / "cells.jsonl").read_text().splitlines()]
    (run / "cells.jsonl").write_text("".join(json.dumps({**r, "bucket_sizes_bytes": BUCKETS}) + "\n"
                                             for r in records))
    return run


@pytest.fixture
def run_dir(tmp_path):
    return _write(tmp_path, _rows())


def _advise(run_dir, *extra):
    return main(["advise", str(run_dir), "--target-gpus", "8", "--network", "ib-ndr400", *extra])


def _printed(capsys) -> tuple[str, list[str]]:
    """(the verdict, the answer's lines) as `bench advise` printed them: the first line, then the indented
    ones under it."""
    out = capsys.readouterr().out.splitlines()
    lines = []
    for line in out[1:]:
        if not line.startswith("  "):
            break
        lines.append(line.strip())
    return out[0], lines


def _line(lines: list[str], key: str) -> str:
    """The answer's line led by `key` ("recipe", "baseline", "target", …)."""
    found = [line for line in lines if line.startswith(key + ": ")]
    assert len(found) == 1, (key, lines)
    return found[0]


def _ranked(run_dir) -> pd.DataFrame:
    advice = pd.read_csv(run_dir / "advice" / "advice.csv")
    return advice[advice["rank"].notna()]


def recomputed(results: pd.DataFrame, row: pd.Series, base: pd.Series) -> tuple[float, float, float]:
    """A second witness of advice.csv's speedup: the run's paired ratio where the row was stepped beside
    the baseline (same configuration but engine, both interleaved, a speed_vs_torch), else the ratio of the
    medians with the two intervals combined in quadrature on the log scale, written out here."""
    r = results.set_index("cell_id").loc[row["cell_id"]]
    b = results.set_index("cell_id").loc[base["cell_id"]]
    same = all(str(r[k]) == str(b[k]) for k in ("world_size", "bucket_cap_mb", "precision", "comm_dtype",
                                                 "grad_accum", "scaling", "per_rank_batch", "global_batch"))
    if same and pd.notna(r["speed_vs_torch"]):
        return r["speed_vs_torch"], r["speed_vs_torch_ci95_low"], r["speed_vs_torch_ci95_high"]
    ratio = b["step_time_ms_p50"] / r["step_time_ms_p50"]
    down = math.hypot(math.log(b["step_time_ms_p50"] / b["step_time_ms_ci95_low"]),
                      math.log(r["step_time_ms_ci95_high"] / r["step_time_ms_p50"]))
    up = math.hypot(math.log(b["step_time_ms_ci95_high"] / b["step_time_ms_p50"]),
                    math.log(r["step_time_ms_p50"] / r["step_time_ms_ci95_low"]))
    return ratio, ratio * math.exp(-down), ratio * math.exp(up)


def test_one_recipe_and_every_speedup_read_back_equals_results(run_dir, capsys):
    assert _advise(run_dir) == 0
    ranked = _ranked(run_dir)
    assert set(ranked["global_batch"]) == {64} and len(ranked) == 4  # the most-measured recipe, alone
    assert list(ranked["engine"]) == ["bucketed", "overlap", "torch", "torch"]
    base = ranked[ranked["baseline"]]
    assert len(base) == 1 and base.iloc[0]["cell_id"] == "torch-mlp.tiny-ws2-b25-fp32-cnone-ga1-strong-gb64"
    results = load_run(run_dir).results
    for _, r in ranked[~ranked["baseline"]].iterrows():
        expected = recomputed(results, r, base.iloc[0])
        got = tuple(r[f"speedup_vs_baseline{end}"] for end in ("", "_ci95_low", "_ci95_high"))
        assert got == pytest.approx(expected, rel=1e-9), r["cell_id"]
    by = ranked.set_index("engine")
    # by hand: bucketed 1.25 [1.25·e^−0.031904, 1.25·e^0.032142] = [1.2108, 1.2908], not paired
    assert by.loc["bucketed", "speedup_vs_baseline_ci95_low"] == pytest.approx(1.2108, abs=1e-4)
    assert by.loc["bucketed", "speedup_vs_baseline_ci95_high"] == pytest.approx(1.2908, abs=1e-4)
    assert not by.loc["bucketed", "speedup_paired"] and by.loc["overlap", "speedup_paired"]
    # Holm over 3 comparisons: overlap's p 0.0002 ≤ 0.05/2 after bucketed's ≈ 0 — both faster
    assert by.loc["overlap", "verdict_vs_baseline"] == "faster"
    weak_torch = ranked[(ranked["engine"] == "torch") & ~ranked["baseline"]].iloc[0]
    assert weak_torch["verdict_vs_baseline"] == "within noise"
    _, lines = _printed(capsys)
    assert _line(lines, "other recipes").startswith("other recipes: this run also measured global batch 32 "
                                                    "at 2 ranks")


def test_the_answer_names_the_simplest_winner_and_every_number_is_in_advice_csv(run_dir, capsys):
    assert _advise(run_dir) == 0
    head, lines = _printed(capsys)
    ranked = _ranked(run_dir)
    use = ranked[ranked["answer_role"] == "use"].iloc[0]
    # bucketed (rank 1) and overlap are both faster, not tied (1,600 [1,561, 1,641] and 1,407 [1,391, 1,422]
    # samples/s do not overlap): bucketed is named, with what it changes: engine and accumulation split
    assert use["engine"] == "bucketed"
    s, low, high = (use[f"speedup_vs_baseline{end}"] for end in ("", "_ci95_low", "_ci95_high"))
    assert head == (f"Use bucketed, accumulation 2 (per-GPU batch 16): {s:.2f}× [{low:.2f}, {high:.2f}] the "
                    f"speed of torch DDP's defaults."), head
    assert _line(lines, "recipe") == "recipe: global batch 64 at 2 ranks, fp32"
    assert _line(lines, "baseline") == ("baseline: torch DDP's defaults = torch DDP, 25 MiB buckets, fp32, "
                                        "per-GPU batch 32")
    # bucketed was not stepped beside torch; Holm over 3 comparisons (overlap, bucketed, torch weak)
    assert _line(lines, "verdict") == ("verdict: faster beyond the noise after Holm's correction over 3 "
                                       "comparisons, from the two cells' own intervals (not stepped side by "
                                       "side)")
    target = _line(lines, "target")
    assert target.startswith(f"target: at 8 GPUs on ib-ndr400 expect "
                             f"{use['projected_efficiency'] * 100:.0f} % "
                             f"[{use['projected_efficiency_low'] * 100:.0f}, "
                             f"{use['projected_efficiency_high'] * 100:.0f}] efficiency "
                             f"({use['projected_samples_per_s']:,.0f} samples/s; per-GPU batch "
                             f"{int(use['projected_per_rank_batch'])}, the recipe kept)"), target
    answer = "\n".join([head, *(line for line in lines if not line.startswith("other recipes"))])
    from_files = {f"{use[c]:.2f}" for c in ("speedup_vs_baseline", "speedup_vs_baseline_ci95_low",
                                             "speedup_vs_baseline_ci95_high")}
    from_files |= {f"{use[c] * 100:.0f}" for c in ("projected_efficiency", "projected_efficiency_low",
                                                    "projected_efficiency_high")}
    from_files |= {f"{use['projected_samples_per_s']:,.0f}",
                   str(int(use["projected_per_rank_batch"])), "2", "16", "64", "8", "400", "32"}
    base = ranked[ranked["baseline"]].iloc[0]  # its bucket size; Holm's family: the rows with a p
    from_files |= {f"{base['bucket_cap_mb']:g}", str(int(ranked["speedup_p"].notna().sum()))}
    assert set(re.findall(r"\d[\d,.]*\d|\d", answer)) <= from_files, answer
    md = (run_dir / "advice" / "advice.md").read_text()
    assert "\n".join([head, "", *(f"- {line}" for line in lines)]) in md and "CPU run" in md


def _tied_rows(a_step, b_step):
    """overlap and bucketed both faster than torch (paired, beyond the noise) and tied with each other."""
    return [_cell("torch", 1, 90.0, 89.0, 91.0), _cell("overlap", 1, 90.0, 89.0, 91.0),
            _cell("bucketed", 1, 90.0, 89.0, 91.0),
            _cell("torch", 2, 50.0, 49.5, 50.5),
            _cell("overlap", 2, a_step, a_step - 1, a_step + 1, paired=(50 / a_step, 50 / a_step - 0.03,
                                                                        50 / a_step + 0.03, 1e-5)),
            _cell("bucketed", 2, b_step, b_step - 1, b_step + 1, paired=(50 / b_step, 50 / b_step - 0.03,
                                                                         50 / b_step + 0.03, 1e-5))]


def test_two_runs_whose_tied_winners_swap_give_one_headline(tmp_path, capsys):
    heads = []
    for name, (a, b) in (("one", (40.0, 40.5)), ("two", (40.5, 40.0))):
        run = _write(tmp_path, _tied_rows(a, b), name)
        assert _advise(run) == 0
        heads.append(_printed(capsys)[0].split(":")[0])
        ranked = _ranked(run)
        named = ranked.loc[ranked["answer_role"].isin(["use", "tied"]), "engine"]
        assert set(named) == {"overlap", "bucketed"}
    # bucketed and overlap change one setting each; bucketed comes first in the registry's order
    assert heads == ["Use bucketed", "Use bucketed"]


def test_tied_with_the_baseline_keeps_torch_ddp_defaults(tmp_path, capsys):
    rows = [_cell("torch", 1, 90.0, 89.0, 91.0), _cell("overlap", 1, 90.0, 89.0, 91.0),
            _cell("torch", 2, 50.0, 49.5, 50.5),
            _cell("overlap", 2, 49.8, 49.3, 50.3, paired=(1.004, 0.99, 1.02, 0.6))]
    run = _write(tmp_path, rows)
    assert _advise(run) == 0
    head, lines = _printed(capsys)
    assert head == "Keep torch DDP's defaults: nothing measured is faster beyond the noise."
    assert _line(lines, "closest") == ("closest: overlap, 1.00× [0.99, 1.02], within noise (its interval "
                                       "holds 1)")
    roles = _ranked(run).set_index("engine")["answer_role"]
    assert roles["torch"] == "keep" and roles["overlap"] == "contender"


def test_wide_intervals_say_no_clear_winner_and_what_to_run(tmp_path, capsys):
    rows = [_cell("torch", 1, 90.0, 89.0, 91.0), _cell("overlap", 1, 90.0, 89.0, 91.0),
            _cell("torch", 2, 50.0, 30.0, 80.0),
            _cell("overlap", 2, 45.0, 30.0, 70.0, paired=(1.11, 0.6, 1.9, 0.5))]
    run = _write(tmp_path, rows)
    assert _advise(run) == 0
    head, lines = _printed(capsys)
    assert head == "Keep torch DDP's defaults for now: no clear winner at fp32."
    assert _line(lines, "closest") == ("closest: overlap, 1.11× [0.60, 1.90], within noise (its interval "
                                       "holds 1); 1 of 1 configurations could still be faster: no speedup "
                                       "interval, or one wider than ±10 %")
    # env.json's command, with the adaptive rounds on
    assert _line(lines, "to separate them") == ("to separate them: `python -m bench run --config gpu-node "
                                                "--set run.target_ci_pct=2`")


def test_a_recipe_that_does_not_divide_holds_the_per_gpu_batch_and_says_the_global_batch(run_dir, capsys):
    # 64 samples per micro-step (torch strong, per-GPU 32 at 2 ranks) do not divide among 3 ranks: the
    # per-GPU micro-batch 32 is held, global batch 96 there; bucketed's 32 per micro-step neither
    assert main(["advise", str(run_dir), "--target-gpus", "3", "--network", "ib-ndr400"]) == 0
    ranked = _ranked(run_dir).set_index("cell_id")
    base = ranked.loc["torch-mlp.tiny-ws2-b25-fp32-cnone-ga1-strong-gb64"]
    assert (base["projected_per_rank_batch"], base["projected_global_batch"]) == (32, 96)
    assert ranked["projected_efficiency"].notna().all()  # every ranked row, rank 1 included, is projected
    _, lines = _printed(capsys)
    assert ("per-GPU micro-batch 16 held: global batch 96 there, as 32 samples per micro-step do not divide "
            "among 3 ranks") in _line(lines, "target")
    # at 8 ranks the recipe divides: kept
    assert _advise(run_dir) == 0
    assert set(_ranked(run_dir)["projected_global_batch"]) == {64}


def test_memory_filter_reads_device_used_then_reserved_then_peak_and_lists_what_is_out(tmp_path, capsys):
    rows = _rows()
    for r in rows:
        if r["world_size"] == 2 and r["engine"] == "bucketed":
            r["device_used_mb"], r["peak_reserved_mb"] = 3000.0, 1200.0  # the GPU's figure decides
        if r["world_size"] == 2 and r["engine"] == "overlap":
            r["peak_reserved_mb"] = 2500.0
    run = _write(tmp_path, rows)
    assert _advise(run, "--memory-gb", "2") == 0
    printed = capsys.readouterr().out
    advice = pd.read_csv(run / "advice" / "advice.csv").set_index("engine")
    assert pd.isna(advice.loc["bucketed", "rank"])
    assert "3,000 MiB (device_used_mb) is over --memory-gb 2 (2,048 MiB)" in advice.loc["bucketed", "why"]
    assert "2,500 MiB (peak_reserved_mb)" in advice.loc["overlap", "why"]
    # the failed naive cell of the recipe and the two excluded ones are in the answer's "did not make it"
    md = (run / "advice" / "advice.md").read_text()
    assert "## Did not make it" in md and "failed: boom" in md
    assert re.search(r"not ranked: naive-\S+-ws2-\S+: failed: boom \(the whole error: \S+results.csv "
                     r"`error`; the ranks' output: \S+/logs/\)", printed)


@pytest.mark.parametrize("extra, words", [
    (("--memory-gb", "0.5"), "--memory-gb=0.5 is below every configuration"),
    (("--network", "carrier-pigeon"), "--network='carrier-pigeon' is not a preset"),
    (("--target-gpus", "0"), "--target-gpus=0"),
    (("--global-batch", "48"), "--global-batch=48: not measured at the largest world size (2 ranks); this "
                               "run has [32, 64]"),
    (("--baseline", "engine=overlap,colour=red"), "'colour=red' is not KEY=VALUE"),
    (("--baseline", "bucket_cap_mb=100"), "--baseline=bucket_cap_mb=100: no ranked configuration"),
    (("--network", "h100-nvlink", "--target-gpus", "12"), "--target-gpus=12: h100-nvlink puts"),
    (("--inter-network", "tin-cans"), "--inter-network='tin-cans'"),
])
def test_bad_input_exits_2_and_writes_nothing(run_dir, capsys, extra, words):
    assert main(["advise", str(run_dir), *extra]) == 2
    assert words in capsys.readouterr().err
    assert not (run_dir / "advice").exists()


def test_a_run_without_ok_cells_exits_2(tmp_path, capsys):
    run = write_run(tmp_path / "run", [row("torch", 2, None, status="failed", error="boom")], env=CPU_ENV)
    assert main(["advise", str(run)]) == 2
    assert "no cell finished with status ok" in capsys.readouterr().err
    assert not (run / "advice").exists()


def test_baseline_flag_picks_another_reference(run_dir):
    assert _advise(run_dir, "--baseline", "engine=overlap") == 0
    ranked = _ranked(run_dir)
    assert ranked.loc[ranked["baseline"], "engine"].tolist() == ["overlap"]
    torch = ranked[ranked["cell_id"] == "torch-mlp.tiny-ws2-b25-fp32-cnone-ga1-strong-gb64"].iloc[0]
    assert torch["speedup_vs_baseline"] == pytest.approx(45.5 / 50.0)  # not paired this way round: medians


def test_best_toml_plans_the_advised_configuration_and_its_baseline(tmp_path, capsys):
    # a run folder this suite wrote (tests/data/traces/README.md): torch, naive, overlap at 2 ranks
    run = tmp_path / "run"
    shutil.copytree(TESTS / "data" / "traces" / "ddpbench-cpu-run", run)
    assert main(["advise", str(run), "--target-gpus", "16", "--network", "h100-nvlink"]) == 0
    capsys.readouterr()
    ranked = _ranked(run)
    named = ranked[ranked["answer_role"].isin(["use", "keep", "unclear", "best"])].iloc[0]
    other = ranked[ranked["answer_role"].isin(["contender"] if named["answer_role"] in ("keep", "unclear")
                                              else ["use"]) | ranked["baseline"]]
    best = run / "advice" / "best.toml"
    assert main(["run", "--config", str(best), "--dry-run"]) == 0
    planned = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    # each configuration's id at the target, its engine, bucket, precision, comm dtype and accumulation kept
    engines = {c.split("-")[0] for c in planned}
    assert engines == set(other["engine"]) | {named["engine"]}
    assert any("-ws16-" in c for c in planned) and all(re.search(r"-ws(1|8|16)-", c) for c in planned)
    for cell in ranked[ranked["cell_id"].isin(other["cell_id"])].itertuples():
        words = re.sub(r"-ws\d+-", "-ws16-", cell.cell_id).split("-strong-")[0].split("-weak-")[0]
        assert any(c.startswith(words) for c in planned), (words, planned)
    ddp = (run / "advice" / "ddp.md").read_text()
    assert "torchrun --nnodes 2 --nproc-per-node 8" in ddp and f"--config {best}" in ddp


def test_a_cpu_run_projected_to_gpus_takes_their_default_sigma_and_says_so(tmp_path):
    from report_fixtures import H100_ENV

    from bench.project import api as project

    # the same rows measured on CPU and on GPU: the base cell's σ = (p90 − p50) / z90 / p50 = 0.1 / 1.2816 =
    # 0.078027 (its p90 is 1.1 × p50); the GPU run keeps it, the CPU run takes the GPU default 0.02 on a GPU
    # network, so the straggler terms are in the ratio 0.078027 / 0.02 = 3.9013 (same compute, same N)
    cpu = _write(tmp_path, _rows(), "cpu")
    gpu = _write(tmp_path, _rows(), "gpu")
    (gpu / "env.json").write_text(json.dumps(H100_ENV))
    cell = ["torch-mlp.tiny-ws2-b25-fp32-cnone-ga1-strong-gb64"]
    on = {name: project.run(run, ["ib-ndr400"], [8], cells=cell, write=False)
          for name, run in (("cpu", cpu), ("gpu", gpu))}
    straggler = {name: p.projection.iloc[0]["straggler_ms"] for name, p in on.items()}
    assert straggler["gpu"] / straggler["cpu"] == pytest.approx(0.1 / 1.2816 / 0.02, rel=1e-3)
    said = "CPU run on ib-ndr400: σ 0.02 and γ 0.29, the GPU defaults"
    assert any(n.startswith(said) for n in on["cpu"].notes)
    assert not any(n.startswith("CPU run on") for n in on["gpu"].notes)


def test_best_toml_names_exactly_the_cells_of_any_configuration(tmp_path):
    # every kind of cell id the matrix makes (engine options, no buckets, fsdp2's reshard word, accumulation,
    # both batch rules) rewritten for the target: the config best.toml is expands to exactly its `cells`
    import tomllib

    from bench.advise import to_run
    from bench.advise.answer import Target
    from bench.config import load_config
    from bench.matrix import expand

    options = ["matrix.engine=torch,overlap,naive,fsdp2", "matrix.compile=none,inductor",
               "matrix.static_graph=false,true", "matrix.comm_hook=none,powersgd",
               "matrix.reshard_after_forward=true,false"]
    sweep = load_config("cpu-smoke", options)
    cells = [c for c in expand(sweep) if c.world_size == 2 and not c.skip_reason]
    base = next(c for c in cells if c.is_baseline and c.grad_accum == 1 and c.scaling == "strong")
    assert len(cells) > 30
    for cell in cells:
        rows = [pd.Series(c.to_dict() | {"engine_options": c.engine_options}) for c in (cell, base)]
        text = to_run.best_toml(rows, {"workload": {"model": "mlp", "model_size": "tiny"}},
                                Target(16, "h100-nvlink"), "RUN")
        (tmp_path / "best.toml").write_text(text)
        planned = sorted(c.cell_id for c in expand(load_config(str(tmp_path / "best.toml"),
                                                               ["run.device=cpu"])))
        assert planned == sorted(tomllib.loads(text)["matrix"]["cells"]), cell.cell_id
        assert any("-ws16-" in c and c.startswith(cell.engine) for c in planned), cell.cell_id


def test_the_projections_interval_travels_into_the_sentence_when_projection_csv_has_one():
    from bench.advise.answer import Target, projection_words
    from bench.advise.api import with_projection

    advice = pd.DataFrame([{"rank": 1, "cell_id": "c", "grad_accum": 1}])
    projected = {"cell_id": "c", "nodes": 8, "per_rank_batch": 4, "global_batch": 256, "efficiency_pct": 81.0,
                 "predicted_samples_per_s": 1000.0, "reason": "", "dominant_term": "exposed_comm",
                 "bottleneck": "overlap-limited"}
    target = Target(64, "h100-nvlink", 8, "ib-ndr400")
    without = with_projection(advice, pd.DataFrame([projected])).iloc[0]
    assert "expect 81 % efficiency (1,000 samples/s; per-GPU batch 4, the recipe kept)" in projection_words(
        without, target, 256)
    with_interval = with_projection(advice, pd.DataFrame([projected | {
        "efficiency_pct_low": 72.0, "efficiency_pct_high": 88.0, "predicted_samples_per_s_low": 890.0,
        "predicted_samples_per_s_high": 1090.0}])).iloc[0]
    low, high = with_interval["projected_efficiency_low"], with_interval["projected_efficiency_high"]
    assert (low, high) == (0.72, 0.88)
    words = projection_words(with_interval, target, 256)
    assert words.startswith("at 64 GPUs on h100-nvlink (8 nodes of 8, ib-ndr400 between) expect 81 % "
                            "[72, 88] efficiency"), words
    assert words.endswith("the loss is the exposed all-reduce of the last buckets (they become ready too "
                          "late to hide)")


# ---- one rule for every word (bench/advise/verdict.py; the second witness: tests/advice_check.py) ----------

def _family(*others, precision="fp32"):
    """torch 50 ms [49.5, 50.5] at 2 ranks and `others` (engine, paired (ratio, low, high, p)) stepped beside
    it, each at the step its ratio gives; the 1-rank cells the projection needs."""
    rows = [_cell("torch", 1, 90.0, 89.0, 91.0, precision=precision),
            _cell("torch", 2, 50.0, 49.5, 50.5, precision=precision)]
    for engine, paired in others:
        step = 50.0 / paired[0]
        rows += [_cell(engine, 1, 90.0, 89.0, 91.0, precision=precision),
                 _cell(engine, 2, step, step * 0.99, step * 1.01, paired=paired, precision=precision)]
    return rows


def test_an_interval_below_1_that_does_not_survive_holm_is_slower_before_correction_everywhere(tmp_path,
                                                                                               capsys):
    # overlap 0.49× [0.43, 0.55] with p 0.03: the smallest of 3 p's, 0.03 > 0.05 / 3, so Holm keeps none.
    # Before: verdict "within noise" while its why said "beyond the noise".
    run = _write(tmp_path, _family(("overlap", (0.49, 0.43, 0.55, 0.03)),
                                   ("bucketed", (1.004, 0.99, 1.02, 0.6)),
                                   ("fsdp2", (1.01, 0.98, 1.04, 0.5))))
    assert _advise(run) == 0
    head, lines = _printed(capsys)
    by = _ranked(run).set_index("engine")
    assert by.loc["overlap", "verdict_vs_baseline"] == "slower before correction"
    assert by.loc["overlap", "why"].endswith("against the baseline: 0.49× [0.43, 0.55], slower before "
                                             "correction (Holm's correction over 3 comparisons does not "
                                             "keep it)")
    assert "noise" not in by.loc["overlap", "why"]  # neither "within" nor "beyond" it: it is neither
    assert by.loc["bucketed", "verdict_vs_baseline"] == "within noise"
    assert head == "Keep torch DDP's defaults: nothing measured is faster beyond the noise."
    # the closest is the best-ranked other that is not below 1: fsdp2 (1.01×), not overlap
    assert _line(lines, "closest").startswith("closest: fsdp2, 1.01× [0.98, 1.04], within noise")


def test_when_every_other_is_slower_the_answer_keeps_the_defaults_and_calls_none_the_best(tmp_path, capsys):
    # fsdp2 0.66× [0.55, 0.73] (wider than ±10 %) and overlap 0.60× [0.58, 0.62], both measured slower.
    # Before: "No clear winner … the best, fsdp2, is 0.66× [0.55, 0.73]".
    run = _write(tmp_path, _family(("fsdp2", (0.66, 0.55, 0.73, 1e-4)),
                                   ("overlap", (0.60, 0.58, 0.62, 1e-5))))
    assert _advise(run) == 0
    head, lines = _printed(capsys)
    assert head == "Keep torch DDP's defaults: nothing measured is faster beyond the noise."
    assert _line(lines, "closest") == (
        "closest: every other configuration's interval lies below 1 (slower); the nearest, fsdp2, is 0.66× "
        "[0.55, 0.73], slower beyond the noise after Holm's correction over 2 comparisons")
    roles = _ranked(run).set_index("engine")["answer_role"]
    assert roles["torch"] == "keep" and roles["fsdp2"] == "contender"


def _two_precisions():
    """fp32: overlap faster than torch (1.10× [1.06, 1.15]); bf16: overlap within noise (1.00× [0.99, 1.02]).
    fp32's overlap is the fastest row of all."""
    fp32 = _family(("overlap", (1.10, 1.06, 1.15, 0.0002)))
    bf16 = _family(("overlap", (1.004, 0.99, 1.02, 0.6)), precision="bf16")
    for r in bf16:  # bf16 slower than fp32 on this CPU-like run: fp32's rows rank first
        for key in ("step_time_ms_p50", "step_time_ms_ci95_low", "step_time_ms_ci95_high"):
            r[key] = r[key] * 1.5
        r["samples_per_s"] = r["global_batch"] / r["step_time_ms_p50"] * 1e3
    return fp32 + bf16


def test_the_answer_is_in_bf16_when_both_were_measured_and_in_the_precision_asked(tmp_path, capsys):
    run = _write(tmp_path, _two_precisions())
    assert _advise(run) == 0
    head, lines = _printed(capsys)
    assert head == "Keep torch DDP's defaults: nothing measured is faster beyond the noise."
    assert _line(lines, "recipe") == ("recipe: global batch 64 at 2 ranks, bf16 (this run also measured fp32 "
                                      "here: `--precision fp32` for it)")
    assert _line(lines, "baseline").endswith(", bf16, per-GPU batch 32")
    assert _advise(run, "--precision", "fp32") == 0
    head, lines = _printed(capsys)
    assert head.startswith("Use overlap: 1.10× [1.06, 1.15] the speed of torch DDP's defaults.")
    assert _line(lines, "recipe").startswith("recipe: global batch 64 at 2 ranks, fp32 (this run also "
                                             "measured bf16")
    # one baseline for every row, at bf16: the answer is at bf16 and is never "Use" with no baseline beside it
    assert _advise(run, "--baseline", "precision=bf16") == 0
    head, lines = _printed(capsys)
    assert head == "Keep the baseline precision=bf16: nothing measured is faster beyond the noise."
    assert _line(lines, "recipe").startswith("recipe: global batch 64 at 2 ranks, bf16")


@pytest.mark.parametrize("extra, words", [
    (("--precision", "fp16"), "--precision=fp16: not measured at global batch 64 (2 ranks); this run has "
                              "['bf16', 'fp32'] there"),
    (("--precision", "fp8"), "--precision='fp8': not one of ['fp32', 'tf32', 'bf16', 'fp16']"),
    (("--precision", "fp32", "--baseline", "precision=bf16"),
     "--precision=fp32 and --baseline precision=bf16"),
    (("--baseline", "engine=torch,engine=naive"), "--baseline='engine=torch,engine=naive': engine is given "
                                                  "twice"),
])
def test_precision_and_baseline_mistakes_exit_2_and_write_nothing(tmp_path, capsys, extra, words):
    run = _write(tmp_path, _two_precisions())
    assert _advise(run, *extra) == 2
    assert words in capsys.readouterr().err
    assert not (run / "advice").exists()


def test_the_answer_names_the_baseline_it_used(run_dir, capsys):
    # against overlap, torch's strong cell is 45.5 / 50 = 0.91× from the two medians: the sentence says so
    assert _advise(run_dir, "--baseline", "engine=overlap") == 0
    head, lines = _printed(capsys)
    assert "torch DDP's defaults" not in head + "".join(lines), (head, lines)
    assert "the baseline engine=overlap" in head
    assert _line(lines, "baseline").startswith("baseline: the baseline engine=overlap = overlap, 25 MiB "
                                               "buckets")
    # the report's first screen reads the answer from advice.md: its speedup card and figure say the same
    assert main(["report", str(run_dir), "--out", str(run_dir.parent / "report")]) == 0
    summary = (run_dir.parent / "report" / "summary.md").read_text()
    assert "speedup over the baseline engine=overlap" in summary
    assert "speedup over torch DDP's defaults" not in summary


def test_a_failed_configuration_is_one_line_with_its_cause_and_where_the_error_is(tmp_path, capsys):
    # a user's module that fsdp2 cannot shard: the error's first line, then its traceback and the module's
    # repr (30 lines before); the advice keeps the first line and says where the rest is
    error = ("TypeError: fully_shard does not support containers that do not implement forward: ModuleList(\n"
             + "".join(f"  ({i}): Block(\n    (attn): Linear(in_features=64, out_features=64)\n  )\n"
                       for i in range(10)) + ")\n…\n  File \"bench/engines/fsdp2.py\", line 80, in wrap")
    rows = _rows() + [row("fsdp2", 2, None, status="failed", error=error, device="cpu")]
    run = _write(tmp_path, rows)
    assert _advise(run) == 0
    printed = capsys.readouterr().out.splitlines()
    failed = [line for line in printed if line.startswith("not ranked: fsdp2")]
    assert failed == [f"not ranked: {rows[-1]['cell_id']}: failed: TypeError: fully_shard does not support "
                      f"containers that do not implement forward: ModuleList( (the whole error: "
                      f"{run}/results.csv `error`; the ranks' output: {run}/logs/)"]
    assert not any("Block(" in line or "File " in line for line in printed)


def test_the_second_witness_finds_each_contradiction_the_issue_saw(tmp_path):
    # hand-written advice files with the three contradictions of issue 46; advice_check must name each
    from advice_check import contradictions

    base = {"rank": 1, "baseline": True, "precision": "fp32", "samples_per_s": 1000.0, "cell_id": "torch-a",
            "speedup_vs_baseline": 1.0, "speedup_vs_baseline_ci95_low": None,
            "speedup_vs_baseline_ci95_high": None, "speedup_p": None, "verdict_vs_baseline": "",
            "answer_role": "unclear", "why": "highest median throughput at this recipe; the baseline itself"}
    slow = {**base, "rank": 2, "baseline": False, "cell_id": "fsdp2-a", "samples_per_s": 660.0,
            "speedup_vs_baseline": 0.49, "speedup_vs_baseline_ci95_low": 0.43,
            "speedup_vs_baseline_ci95_high": 0.55, "speedup_p": 0.03, "verdict_vs_baseline": "within noise",
            "answer_role": "contender", "why": "34.0 % below the best, beyond the noise"}
    wide = {**slow, "rank": 3, "cell_id": "overlap-a", "speedup_vs_baseline": 0.9,
            "speedup_vs_baseline_ci95_low": 0.5, "speedup_vs_baseline_ci95_high": 1.6, "speedup_p": 0.7,
            "answer_role": "", "why": "tied: its 95 % interval overlaps the best one's"}
    folder = tmp_path / "advice"
    folder.mkdir()
    pd.DataFrame([base, slow, wide]).to_csv(folder / "advice.csv", index=False)
    (folder / "advice.md").write_text("# Advice\n\nNo clear winner at this precision: at global batch 64 the "
                                      "best, fsdp2, is 0.49× [0.43, 0.55] torch DDP's defaults.\n")
    found = "\n".join(contradictions(folder))
    assert "fsdp2-a: why says beyond the noise" in found
    assert "fsdp2-a: verdict 'within noise', its interval and p say 'slower before correction'" in found
    assert "contender fsdp2-a lies below 1 while overlap-a does not" in found
    assert "an interval below 1 is called the best or advised" in found
    (folder / "advice.md").write_text("# Advice\n\nUse torch DDP: 1,000 samples/s, no torch DDP baseline "
                                      "measured there.\n")
    assert "answer says Use without a baseline measured beside it" in "\n".join(contradictions(folder))
    shutil.rmtree(folder)  # made wrong on purpose: not for conftest's check of what tests leave behind
