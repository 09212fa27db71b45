"""What the commands print for a user's slips and for results that need a word of explanation (issue 46's
console items): a mistyped flag gets its command's usage and the flag it was meant to be, a mistyped preset
or key the nearest name; a flat network given --gpus-per-node says the flag does not apply; a race that
raced out nothing says why; compare says when the runs searched differently; a negative one-rank sync
overhead reads as noise; a GPU plan is capped at the GPUs it plans for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.__main__ import main as bench_main


@pytest.mark.parametrize("argv, words", [
    (["run", "--confg", "default"], ["python -m bench run: error: unrecognized arguments: --confg default",
                                     "did you mean: --confg → --config?"]),
    (["advise", "RUN", "--tagret-gpus", "8"],
     ["python -m bench advise: error", "--tagret-gpus → --target-gpus"]),
    (["run", "--config", "defualt", "--dry-run"], ["no such preset", "did you mean 'default'?"]),
    (["run", "--config", "cpu-smoke", "--set", "matrix.engin=torch", "--dry-run"],
     ["matrix.engin='torch': unknown key", "did you mean 'engine'?"]),
    (["run", "--config", "cpu-smoke", "--set", "matrix.scaling=stronk", "--dry-run"],
     ["matrix.scaling='stronk': must be one of ['strong', 'weak']; did you mean 'strong'?"]),
])
def test_a_typo_gets_the_commands_usage_and_the_nearest_name(argv, words, capsys):
    try:
        code = bench_main(argv)
    except SystemExit as exit_:  # argparse's error: the command's own usage, then the message
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    for w in words:
        assert w in err, err
    assert "{run,report,compare" not in err  # not the top-level usage


def test_a_flat_network_with_gpus_per_node_says_the_flag_does_not_apply(tmp_path, capsys):
    argv = ["project", "--model", "mlp:tiny", "--step-ms", "10", "--per-gpu-batch", "8",
            "--world-sizes", "8,16", "--out", str(tmp_path / "p")]
    assert bench_main([*argv, "--network", "ib-ndr400", "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert ("note: --gpus-per-node 8 does not apply to --network ib-ndr400: a network preset alone is "
            "flat") in out
    assert "--network h100-nvlink --inter-network ib-ndr400 --gpus-per-node 8" in out
    assert bench_main([*argv, "--network", "h100-nvlink", "--gpus-per-node", "8"]) == 0  # it applies: no note
    assert bench_main([*argv, "--network", "ib-ndr400"]) == 0  # not given: nothing to say
    assert "does not apply" not in capsys.readouterr().out


def test_a_race_that_raced_out_nothing_says_why():
    from bench.run.runner import nothing_raced_out

    def rec(engine, gb, status="ok"):
        return {"model": "mlp", "model_size": "tiny", "world_size": 2, "global_batch": gb, "status": status,
                "engine": engine}

    said = nothing_raced_out([rec("torch", 8), rec("overlap", 8), rec("torch", 16), rec("overlap", 16)])
    assert said.startswith("race: nothing raced out: in each of the 2 recipes with two or more "
                           "configurations, none was slower than another beyond the race's test (5 % ")
    said = nothing_raced_out([rec("torch", 8), rec("overlap", 8, "failed"), rec("torch", 16)])
    assert "no recipe (global batch at a world size) had two configurations that finished" in said


def test_compare_says_when_the_runs_searched_differently():
    from bench.report.comparability import search_warning

    def run(search):
        return SimpleNamespace(config={"run": {"search": search}} if search else {})

    assert search_warning([run("grid"), run(None)]) == ""  # grid is the default
    said = search_warning([run(None), run("race")])
    assert said.startswith("The runs searched differently (run.search grid vs race)")


def test_a_negative_one_rank_sync_overhead_reads_as_noise():
    from bench.run.progress import summary_line

    record = {"status": "ok", "cell_id": "torch-mlp.tiny-ws1", "world_size": 1, "step_time_ms_p50": 0.8,
              "step_time_ms_p90": 0.9, "samples_per_s": 2500.0, "exposed_comm_ms": -0.12}
    line = summary_line(record)
    assert "sync overhead (1 rank) ~0 ms (-0.12: the step and the compute-only step within noise)" in line
    assert "sync overhead (1 rank) 0.05 ms" in summary_line(record | {"exposed_comm_ms": 0.05})


def test_a_gpu_plan_is_capped_at_the_gpus_it_plans_for(capsys):
    # --plan-only --gpus-per-node 1 planned world size 8 on one GPU; now each world size above
    # --nnodes × --gpus-per-node is skipped with its reason (the preset sets skip_world_sizes_above_gpus)
    assert bench_main(["run", "--config", "cpu-smoke", "--set", "run.device=cuda", "--set",
                       "matrix.world_size=1,2,4", "--set", "matrix.engine=torch", "--set",
                       "run.skip_world_sizes_above_gpus=true", "--plan-only",
                       "--gpus-per-node", "1", "--nnodes", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("run   torch-mlp.tiny-ws2-") for line in lines)
    ws4 = [line for line in lines if "-ws4-" in line]
    assert ws4 and all(line.startswith("skip") and "world_size=4 is above the 2 GPUs present" in line
                       for line in ws4)
