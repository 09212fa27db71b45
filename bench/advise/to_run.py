"""The advice as something to run: advice/best.toml, a ddpbench config that measures exactly the advised
configuration and its baseline at the target's world sizes, and advice/ddp.md, the same settings as
constructor arguments and hook registration for the user's own training script, with the launch lines.

best.toml names its cells exactly (`matrix.cells`, over the cross product of the two configurations'
values). At the target each configuration keeps its recipe where the recipe's micro-batch divides among
the target's ranks (strong scaling from it), else holds its per-GPU micro-batch (weak scaling), as the
projection does (bench.project.project.from_cell). One [workload] has one global batch and one per-rank
batch, so two configurations that need different batches of one rule are measured at the target's world
size only, the second by the other rule (strong from G = per-GPU batch × ranks gives the same cell there).
World sizes: 1 (the efficiency's T1), one node, the target, where the batch divides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from bench import engines
from bench.advise.answer import Target, engine_words
from bench.config import toml_value
from bench.schema import DEFAULT_BUCKET_MB, ENGINE_OPTIONS

ID_BATCH = re.compile(r"-ws\d+-(.*)-(strong|weak)-gb\d+")


@dataclass(frozen=True)
class AtTarget:
    """How one configuration (a results row) is measured at the target: scaling, the workload batch it
    reads (strong: global_batch, the micro-batch over all ranks; weak: per_rank_batch), and whether that
    gives its cell at the target's world size only (`switched`: the other rule than its own)."""

    row: pd.Series
    scaling: str
    batch: int
    switched: bool = False

    def cell_id(self, world_size: int) -> str:
        """The configuration's cell id at `world_size` in best.toml (the run's id with its world size,
        scaling and global batch replaced: the id's other words are the configuration's)."""
        k = int(self.row["grad_accum"])
        gb = self.batch * k if self.scaling == "strong" else self.batch * world_size * k
        return ID_BATCH.sub(lambda m: f"-ws{world_size}-{m.group(1)}-{self.scaling}-gb{gb}",
                            str(self.row["cell_id"]))

    def other_rule(self, gpus: int) -> AtTarget:
        """The same cell at `gpus` ranks by the other batch rule (module docstring)."""
        if self.scaling == "strong":
            return AtTarget(self.row, "weak", self.batch // gpus, switched=True)
        return AtTarget(self.row, "strong", self.batch * gpus, switched=True)


def at_target(row: pd.Series, gpus: int) -> AtTarget:
    """The recipe kept (strong from its micro-batch) where it divides among `gpus`, else the per-GPU
    micro-batch held (weak)."""
    micro = int(row["per_rank_batch"]) * int(row["world_size"])
    if micro % gpus == 0:
        return AtTarget(row, "strong", micro)
    return AtTarget(row, "weak", int(row["per_rank_batch"]))


def world_sizes(target: Target) -> list[int]:
    """1 (the efficiency's T1), one node, the target. A strong batch that divides among the target's
    ranks divides among these too (the target is a whole number of nodes, or fits in one)."""
    return sorted({1, min(target.gpus_per_node, target.gpus), target.gpus})


def plans_for(rows: list[pd.Series], gpus: int) -> list[AtTarget]:
    """Each row's AtTarget; a second one whose batch would clash with the first's in one [workload] (same
    rule, other batch) is measured by the other rule at the target only."""
    plans = [at_target(r, gpus) for r in rows]
    for i in range(1, len(plans)):
        if plans[i].scaling == plans[0].scaling and plans[i].batch != plans[0].batch:
            plans[i] = plans[i].other_rule(gpus)
    return plans


def best_toml(rows: list[pd.Series], run_config: dict, target: Target, run_dir: str) -> str:
    """best.toml for `rows` (the advised configuration first, then its baseline or contender; results
    rows with their engine options), measured at the target (module docstring)."""
    rows = list({r["cell_id"]: r for r in rows}.values())  # the advised configuration may be the baseline
    plans = plans_for(rows, target.gpus)
    sizes = world_sizes(target)
    cells = [p.cell_id(n) for p in plans for n in sizes if n == target.gpus or not p.switched]
    workload = dict(run_config.get("workload", {}))
    for plan in plans:
        workload["global_batch" if plan.scaling == "strong" else "per_rank_batch"] = plan.batch
    matrix = {"engine": _values(rows, "engine"), "world_size": sizes,
              "bucket_cap_mb": _values(rows, "bucket_cap_mb", default=DEFAULT_BUCKET_MB),
              "precision": _values(rows, "precision"), "comm_dtype": _values(rows, "comm_dtype"),
              "grad_accum": _values(rows, "grad_accum", cast=int),
              "scaling": sorted({p.scaling for p in plans})}
    for option in ENGINE_OPTIONS:
        values = [_typed(r.get(option.name), option.kind) for r in rows
                  if pd.notna(r.get(option.name)) and str(r.get(option.name)) != ""]  # "": not its engine's
        if any(v != option.default for v in values):
            matrix[option.name] = list(dict.fromkeys([option.default, *values]))
    matrix["cells"] = cells
    about = f"bench advise {run_dir}: the advised configuration and its baseline at {target.words()}"
    lines = [f"description = {_toml(about)}",
             "# `python -m bench run --config THIS --dry-run` lists its cells; `bench slurm --config THIS`",
             "# runs them on a cluster (advice/ddp.md). [workload] is the run's, its batches the recipe's.",
             "",
             "[matrix]", *(f"{k} = {_toml(v)}" for k, v in matrix.items()), "",
             "[workload]", *(f"{k} = {_toml(v)}" for k, v in workload.items() if v is not None), "",
             "[run]", 'device = "auto"', "", "[profile]", "enabled = true",
             f"cells = {_toml([f'*-ws{target.gpus}-*'])}", "",
             "[on_cpu]", "# a CPU machine can plan it (--dry-run) and run it, slowly: ranks share cores",
             '"run.allow_oversubscribe" = true', '"run.threads_per_rank" = 1']
    return "\n".join(lines) + "\n"


def _typed(value, kind):
    """A results value as the option's type (bools are read back from CSV text)."""
    if kind is bool:
        return str(value).strip().lower() in ("true", "1", "1.0")
    return kind(value)


def _values(rows: list[pd.Series], key: str, default=None, cast=None) -> list:
    out = []
    for r in rows:
        value = r[key]
        if pd.isna(value):
            value = default
        if value is None:
            continue
        out.append(cast(value) if cast else (float(value) if isinstance(value, float) else value))
    return list(dict.fromkeys(out))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return toml_value(value)  # a newline or a quote in a value stays valid TOML
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return repr(float(value))
    return repr(value)


def ddp_markdown(row: pd.Series, answer: str, target: Target, best: str, there: str) -> str:
    """advice/ddp.md: the advised configuration in the user's own script (`there`: its batch at the target,
    in words), and how to launch it."""
    wire = "as computed (fp32)" if row["comm_dtype"] == "none" else row["comm_dtype"]
    imports, body = wrap_code(row)
    lines = ["# The advice in your own training script", "", answer, "",
             f"Settings: {engine_words(row['engine'])}, {_bucket(row)}, precision {row['precision']}, "
             f"gradients on the wire {wire}, per-GPU micro-batch {int(row['per_rank_batch'])}, accumulation "
             f"{int(row['grad_accum'])}: global batch {int(row['global_batch'])} at {int(row['world_size'])} "
             f"ranks as measured; {there}.", "",
             "```python", *imports, "", *body, "", *step_code(row), "```", ""]
    per_node = min(target.gpus_per_node, target.gpus)
    nodes = max(1, target.gpus // per_node)
    lines += ["## Launch", "", "```bash"]
    if nodes == 1:
        lines.append(f"torchrun --standalone --nproc-per-node {per_node} train.py")
    else:
        lines += [f"# on each of the {nodes} nodes (MASTER_ADDR: the first node's address)",
                  f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
                  "--rdzv-endpoint $MASTER_ADDR:29500 train.py"]
    lines.append("# or first measure the advice against its baseline there (advice/best.toml):")
    lines.append(f"python -m bench slurm --config {best} --nodes {nodes} --gpus-per-node {per_node} --submit"
                 if nodes > 1 else f"python -m bench run --config {best} --report")
    return "\n".join(lines + ["```", ""])


def _bucket(row: pd.Series) -> str:
    return "no buckets" if pd.isna(row["bucket_cap_mb"]) else f"{row['bucket_cap_mb']:g} MiB buckets"


def wrap_code(row: pd.Series) -> tuple[list[str], list[str]]:
    """(imports, the wrapper's construction) for the row's engine: the process group and device, then the
    engine's own script lines (Engine.script_wrap, as bench/engines builds it)."""
    imports = ["import contextlib", "import os", "", "import torch", "import torch.distributed as dist"]
    body = ['dist.init_process_group("nccl")', 'local_rank = int(os.environ["LOCAL_RANK"])',
            "torch.cuda.set_device(local_rank)", "model = model.cuda()"]
    try:
        more, lines = engines.get(row["engine"]).script_wrap(row)
    except (NotImplementedError, KeyError) as exc:
        return imports, [*body, f"# {exc}: wrap `model` as that engine's module does"]
    return imports + more, body + lines


def step_code(row: pd.Series) -> list[str]:
    """One optimizer step at the row's precision and accumulation (no_sync on all but the last micro-batch:
    FSDP2's set_requires_gradient_sync; a GradScaler for fp16)."""
    k, precision = int(row["grad_accum"]), row["precision"]
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(precision)
    scaled = precision == "fp16"
    lines = [f"# one optimizer step: {k} micro-batch{'es' if k > 1 else ''} of {int(row['per_rank_batch'])} "
             f"per GPU, {precision}"]
    if scaled:
        lines.append("scaler = torch.amp.GradScaler()  # once, before the training loop")
    if precision == "tf32":
        lines.append('torch.backends.cuda.matmul.fp32_precision = "tf32"  # once')
    forward = f"loss = loss_fn(model(x), y){f' / {k}' if k > 1 else ''}"
    backward = "scaler.scale(loss).backward()" if scaled else "loss.backward()"
    cast = [f'with torch.autocast("cuda", dtype={dtype}):', f"    {forward}"] if dtype else [forward]
    body = [*cast, backward]
    if k == 1:
        lines += ["x, y = next(batches)", *body]
    else:  # the engine's way of skipping the sync on all but the last micro-batch
        facts = engines.get(row["engine"]) if row["engine"] in engines.names() else engines.reference()
        lines += facts.script_accumulate(k, body)
    lines += ["scaler.step(optimizer)" if scaled else "optimizer.step()"]
    if scaled:
        lines.append("scaler.update()")
    lines.append("optimizer.zero_grad(set_to_none=True)")
    return lines

