"""The parity gate's margin (bench/worker/parity.py): how far honest engines and gradient-dropping ones end
from eager torch DDP, in units of the gate's bound, on a shallow and a deep transformer at every precision.

For each model and precision, on 2 ranks (gloo, CPU): eager torch DDP (the reference), its rerounded twin
under several seeds of its rounding (each gives the gate a bound: DRIFT_FACTOR × the twin's drift), honest
fsdp2 and torch + inductor, and fsdp2 with each of tests/parity_mutants.py's corruptions, all stepped
through the same batches from the same weights. Per engine and twin seed the gate's verdict and its
ratio, the largest distance / bound over the gate's checks (≤ 1 passes); then per precision and model the
worst honest ratio and the best gradient-dropping one (DROPPING), whether every honest run passed and every
dropping one was caught, and the least ratio of the subtler corruptions. A table for docs/design.md
"Parity gates":

    PYTHONPATH=. python benchmarks/parity_margin.py [--steps 25] [--seeds 5] [--models tiny,deep]
        [--precisions fp32,bf16,fp16] [--no-compile] [--mutants no-sync,drop-tensor,... | none]

`--mutants none` runs the honest engines alone: many twin roundings (--seeds 20) are that many gates of the
same honest run, a false `diverged` among them a gate too tight.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tests.dist_utils import run_distributed  # noqa: E402
from tests.parity_mutants import MUTANTS, gate_cases  # noqa: E402

WORLD_SIZE = 2
# the mutants that lose gradients outright: the gate must call them diverged everywhere; the others (1 % of
# the elements dropped, 10 % noise) are reported beside them: at bf16 a 1 % drop is within rounding's reach
DROPPING = ("no-sync", "drop-tensor", "drop-shard")


def margins(model_size: str, precision: str, steps: int, seeds: int, compile_: bool,
            mutants: tuple[str, ...] = MUTANTS) -> list[dict]:
    engines = ["fsdp2", *(["torch+inductor"] * compile_), *(f"fsdp2 {m}" for m in mutants)]
    return run_distributed(gate_cases, WORLD_SIZE, "transformer", model_size, precision, steps, seeds,
                           engines, timeout_s=7200)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=5, help="twin roundings per case (each a bound)")
    parser.add_argument("--models", default="tiny,deep")
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    parser.add_argument("--no-compile", action="store_true", help="leave torch + inductor out (slow on CPU)")
    parser.add_argument("--mutants", default=",".join(MUTANTS), help="the broken engines, or 'none'")
    args = parser.parse_args(argv)
    mutants = () if args.mutants == "none" else tuple(args.mutants.split(","))
    unknown = [m for m in mutants if m not in MUTANTS]
    if unknown:
        parser.error(f"--mutants={args.mutants!r}: {unknown} not among {list(MUTANTS)}")
    torch.set_num_threads(1)
    summary = []
    for model_size in args.models.split(","):
        for precision in args.precisions.split(","):
            t0 = time.time()
            rows = margins(model_size, precision, args.steps, args.seeds, not args.no_compile, mutants)
            print(f"\n## transformer.{model_size} {precision}, {args.steps} steps, {args.seeds} twin "
                  f"roundings ({time.time() - t0:.0f} s)")
            print(f"{'engine':<22} {'update':>9} {'tensor':>9} {'loss':>9} {'bounds (update, loss)':>24} "
                  f"{'ratio min/med/max':>20}  verdicts")
            for name in dict.fromkeys(r["engine"] for r in rows):
                mine = [r for r in rows if r["engine"] == name]
                if mine[0]["parity_gate"].startswith("failed"):
                    print(f"{name:<22} {mine[0]['parity_gate'][:90]}")
                    continue
                ratios = sorted(r["ratio"] for r in mine)
                loss_bounds = [r["parity_loss_bound"] for r in mine if r["parity_loss_bound"] is not None]
                verdicts = sorted({r["parity_gate"].split(" ")[0] for r in mine})
                bounds = [r["parity_update_bound"] for r in mine]
                print(f"{name:<22} {mine[0]['param_update_distance']:>9.3g} "
                      f"{mine[0]['param_update_distance_max']:>9.3g} {mine[0]['loss_rel_distance']:>9.3g} "
                      f"{min(bounds):>10.3g}-{max(bounds):<.3g}"
                      f" {(f'{min(loss_bounds):.3g}' if loss_bounds else '—'):>10} "
                      f"{ratios[0]:>6.3g}/{ratios[len(ratios) // 2]:.3g}/{ratios[-1]:.3g}  "
                      f"{','.join(verdicts)}")
            honest = [r for r in rows if " " not in r["engine"]]
            broken = [r for r in rows if r["engine"].split(" ")[-1] in DROPPING]
            worst = max(r["ratio"] for r in honest)
            best = min((r["ratio"] for r in broken), default=float("inf"))
            ok = all(r["parity_gate"].startswith("passed") for r in honest) and all(
                r["parity_gate"] == "diverged" or r["parity_gate"].startswith("failed") for r in broken)
            subtle = {m: min((r["ratio"] for r in rows if r["engine"] == f"fsdp2 {m}"), default=float("nan"))
                      for m in MUTANTS if m not in DROPPING}
            summary.append((model_size, precision, worst, best, ok, subtle))
            apart = f"{best / worst:.3g}× apart" if worst > 0 else "honest engines at 0: bit-identical"
            print(f"margin: worst honest ratio {worst:.3g}, best broken ratio {best:.3g} ({apart}); every "
                  f"honest passed and every broken diverged: {ok}", flush=True)
    others = [m for m in MUTANTS if m not in DROPPING]
    print("\n| model | precision | worst honest | best gradient-dropping | all right | "
          + " | ".join(f"{m} (least)" for m in others) + " |\n|---|---|---|---|---|" + "---|" * len(others))
    for model_size, precision, worst, best, ok, subtle in summary:
        print(f"| transformer.{model_size} | {precision} | {worst:.3g} | {best:.3g} | {ok} | "
              + " | ".join(f"{subtle[m]:.3g}" for m in others) + " |")
    return 0 if all(s[4] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
