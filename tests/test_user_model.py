"""Bring your own model: `workload.model = "path/to/file.py:Name" | "package.module:Name"`.

End to end through the runner (torchrun, gloo on CPU) with examples/gru_classifier.py and with a minimal
model that leaves every optional method out; each error path of a spec (exit 2, the spec and the cause
named, no run folder); spec resolution, cell ids, what env.json records, and the example's FLOP formula.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import textwrap

import pytest
import torch
from test_runner import REPO, assert_no_orphans, bench_cmd, read_csv, run_bench
from torch.utils.flop_counter import FlopCounterMode

from bench.__main__ import main as bench_main
from bench.config import config_from_dict, load_config
from bench.matrix import expand
from bench.workloads import (
    UserModelError,
    WorkloadOptions,
    check_model_unchanged,
    describe_model_spec,
    get_workload,
    model_label,
    resolve_model_spec,
)

EXAMPLE = "examples/gru_classifier.py"
EXAMPLE_SPEC = f"{EXAMPLE}:GRUClassifier"

# A complete workload with no optional method: its FLOP, token and seq_len columns must stay empty.
PLAIN_MODEL = '''
import torch
from torch import nn
from bench.workloads import SyntheticDataset, Workload


class Pairs(SyntheticDataset):
    def __init__(self, n, device, seed):
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(n, 6, generator=gen).to(device)
        self.targets = torch.randn(n, 1, generator=gen).to(device)

    def __len__(self):
        return self.inputs.shape[0]

    def batch(self, indices):
        i = indices.to(self.inputs.device)
        return {"inputs": self.inputs[i], "targets": self.targets[i]}


class PlainNet(Workload):
    def build_model(self):
        return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 1))

    def make_dataset(self, num_samples, device, seed):
        return Pairs(num_samples, device, seed)

    def loss(self, model, batch):
        return nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])
'''


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(*argv: str) -> int:
    return bench_main(["run", *argv])


# ---- end to end -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_example_every_engine_world_sizes_1_2_accumulation_1_2(tmp_path):
    out = tmp_path / "run"
    # As README writes it: a path relative to the directory `bench run` starts in (REPO here).
    proc = run_bench(out, f"workload.model={EXAMPLE_SPEC}", "matrix.engine=torch,naive,bucketed,overlap",
                     "matrix.world_size=1,2", "matrix.grad_accum=1,2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    assert len(rows) == 4 * 2 * 2
    spec = f"{REPO / EXAMPLE}:GRUClassifier"
    label = model_label(spec)
    assert re.fullmatch(r"GRUClassifier-[0-9a-f]{8}", label)
    flops = get_workload(spec, "tiny").train_flops_per_sample()   # fixed length: the same for every sample
    for row in rows:
        assert row["status"] == "ok", (row["cell_id"], row["error"])   # `diverged` when ranks disagree
        assert row["model"] == spec and row["model_size"] == "tiny" and row["seq_len"] == "16"
        assert row["cell_id"].startswith(f"{row['engine']}-{label}.tiny-ws{row['world_size']}-")
        assert (out / row["trace_dir"]).is_dir()
        samples_per_s = float(row["samples_per_s"])
        # The optional methods are given: tokens/s = samples/s × 16 tokens, TFLOP/s = samples/s × FLOPs.
        assert float(row["tokens_per_s"]) == pytest.approx(samples_per_s * 16, rel=1e-9)
        assert float(row["model_tflops_per_s"]) == pytest.approx(samples_per_s * flops / 1e12, rel=1e-9)
        assert row["mfu"] == ""   # CPU: no peak FLOP/s, so no MFU, whatever the workload says
    env = json.loads((out / "env.json").read_text())
    assert env["user_model"] == {
        "spec": spec, "class": "GRUClassifier", "module": None, "file": str(REPO / EXAMPLE),
        "sha256": hashlib.sha256((REPO / EXAMPLE).read_bytes()).hexdigest(), "label": label}
    assert f'model = "{spec}"' in (out / "config.toml").read_text()
    assert_no_orphans(out)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_module_spec_without_optional_methods_from_another_directory(tmp_path):
    """`package.module:Name` found through the working directory, in the launcher and in both ranks."""
    write(tmp_path / "mymodels" / "plain.py", PLAIN_MODEL)
    out = tmp_path / "run"
    cmd = bench_cmd(out, "workload.model=mymodels.plain:PlainNet", "matrix.engine=overlap",
                    "matrix.world_size=2", "matrix.grad_accum=2", "profile.enabled=false")
    pythonpath = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(pythonpath)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    assert [r["status"] for r in rows] == ["ok"]
    row = rows[0]
    assert row["model"] == "mymodels.plain:PlainNet" and float(row["samples_per_s"]) > 0
    for col in ("tokens_per_s", "model_tflops_per_s", "mfu", "seq_len"):
        assert row[col] == "", col   # not provided by the workload: empty, never 0
    recorded = json.loads((out / "env.json").read_text())["user_model"]
    assert recorded["module"] == "mymodels.plain" and recorded["file"] == str(tmp_path / "mymodels/plain.py")
    assert recorded["sha256"] == hashlib.sha256((tmp_path / "mymodels/plain.py").read_bytes()).hexdigest()
    assert_no_orphans(out)


# ---- error paths: exit 2, the spec and the cause named, nothing created -----------------------------

NOT_A_WORKLOAD = "from torch import nn\n\nclass Net(nn.Module):\n    pass\n\nfactory = len\n"
ABSTRACT = ("from bench.workloads import Workload\n\nclass Half(Workload):\n"
            "    def build_model(self):\n        pass\n")
RAISES_ON_IMPORT = "raise RuntimeError('no GPU budget today')\n"
CTOR_RAISES = PLAIN_MODEL + ("\n\nclass Picky(PlainNet):\n    def __init__(self, size, options=None):\n"
                             "        raise KeyError(f'no weights for {size}')\n")


@pytest.mark.parametrize("files, spec, causes", [
    ({}, "models/missing.py:Net", ["no such file", "models/missing.py"]),
    ({}, "no_such_pkg_h14.layers:Net", ["no module named 'no_such_pkg_h14'"]),
    ({"m.py": PLAIN_MODEL}, "m.py:Missing", ["defines no 'Missing'", "['PlainNet']"]),
    ({"m.py": NOT_A_WORKLOAD}, "m.py:Net", ["Net is class Net, not a subclass of bench.workloads.Workload"]),
    ({"m.py": NOT_A_WORKLOAD}, "m.py:factory", ["factory is a builtin_function_or_method, not a subclass"]),
    ({"m.py": ABSTRACT}, "m.py:Half", ["Half('tiny', options) raised TypeError", "abstract"]),
    ({"m.py": CTOR_RAISES}, "m.py:Picky", ["Picky('tiny', options) raised KeyError", "no weights for tiny"]),
    ({"m.py": RAISES_ON_IMPORT}, "m.py:Net", ["raised RuntimeError: no GPU budget today"]),
    ({"m.py": "def broken(:\n"}, "m.py:Net", ["raised SyntaxError"]),
    ({}, "models/net:Net", ["'models/net' is not a .py file"]),
    ({}, "my-models:Net", ["neither a .py file nor a dotted module name"]),
    ({}, "m.py:", ["expected 'path/to/file.py:Name'"]),
])
def test_bad_spec_exits_2_naming_spec_and_cause(tmp_path, monkeypatch, capsys, files, spec, causes):
    for name, text in files.items():
        write(tmp_path / name, text)
    monkeypatch.chdir(tmp_path)   # relative paths resolve against the directory `bench run` starts in
    out = tmp_path / "run"
    assert run_cli("--config", "cpu-smoke", "--set", f"workload.model={spec}", "--out", str(out)) == 2
    err = capsys.readouterr().err
    target, _, name = spec.rpartition(":")
    assert target in err and f":{name}'" in err, err   # the spec (a relative path shown resolved)
    for cause in causes:
        assert cause in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not (tmp_path / "results").exists()


def test_example_with_an_unknown_size_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    spec = f"{REPO / EXAMPLE}:GRUClassifier"
    assert run_cli("--config", "cpu-smoke", "--set", f"workload.model={spec}",
                   "--set", "workload.model_size=huge", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert spec in err and "GRUClassifier('huge', options) raised ValueError: model_size='huge'" in err
    assert not out.exists()


# ---- resolution, cell ids, env.json ------------------------------------------------------------------

def test_relative_file_spec_resolves_against_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "sub" / "net.py", PLAIN_MODEL)
    monkeypatch.chdir(tmp_path)
    absolute = f"{tmp_path}/sub/net.py:PlainNet"
    assert resolve_model_spec("sub/net.py:PlainNet") == absolute
    assert resolve_model_spec("./sub/../sub/net.py:PlainNet") == absolute
    assert resolve_model_spec(absolute) == absolute   # idempotent: a worker re-reading the plan
    for name in ("mlp", "hf:some/dir", "pkg.mod:Name"):
        assert resolve_model_spec(name) == name
    config = load_config("cpu-smoke", ["workload.model=sub/net.py:PlainNet"])
    assert config.workload.model == absolute
    monkeypatch.chdir(REPO)   # elsewhere, the resolved config still names the same file
    assert config_from_dict(config.to_dict()).workload.model == absolute


def test_cell_ids_are_safe_stable_and_tell_same_named_classes_apart(tmp_path):
    a = write(tmp_path / "a" / "net.py", PLAIN_MODEL)
    b = write(tmp_path / "b:odd dir" / "net.py", PLAIN_MODEL)
    specs = [f"{a}:PlainNet", f"{b}:PlainNet"]
    ids = []
    for spec in specs:
        config = load_config("cpu-smoke", [f"workload.model={spec}", "matrix.engine=torch",
                                           "matrix.world_size=2", "matrix.grad_accum=1",
                                           "matrix.scaling=strong"])
        (cell,) = expand(config)
        assert cell.model == spec
        assert re.fullmatch(r"torch-PlainNet-[0-9a-f]{8}\.tiny-ws2-b0\.05-fp32-cnone-ga1-strong-gb8",
                            cell.cell_id)
        ids.append(cell.cell_id)
    assert ids[0] != ids[1]
    digest = hashlib.sha256(specs[0].encode()).hexdigest()[:8]
    assert model_label(specs[0]) == model_label(specs[0]) == f"PlainNet-{digest}"
    assert model_label("mlp") == "mlp"


def test_dry_run_lists_the_cells_and_estimates(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert run_cli("--config", "cpu-smoke", "--set", f"workload.model={EXAMPLE_SPEC}", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert printed.count("GRUClassifier-") == 32 and "32 cells to run" in printed  # strong and weak


def test_describe_and_resume_check_follow_the_file_content(tmp_path, monkeypatch):
    path = write(tmp_path / "net.py", PLAIN_MODEL)
    spec = f"{path}:PlainNet"
    recorded = describe_model_spec(spec)
    assert recorded["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert describe_model_spec("mlp") is None and describe_model_spec("hf:x") is None
    check_model_unchanged(recorded, spec)   # unchanged: fine
    assert get_workload(spec, "any").build_model()[0].out_features == 5
    path.write_text(PLAIN_MODEL + "\n# tuned\n")
    with pytest.raises(UserModelError, match="changed since the run recorded it"):
        check_model_unchanged(recorded, spec)
    # An edited file is imported afresh, not served from the first import.
    path.write_text(PLAIN_MODEL.replace("nn.Linear(6, 5)", "nn.Linear(6, 7)").replace("(5, 1)", "(7, 1)"))
    assert get_workload(spec, "any").build_model()[0].out_features == 7


def test_resume_refuses_an_edited_model_file(tmp_path, capsys):
    path = write(tmp_path / "net.py", PLAIN_MODEL)
    out = tmp_path / "run"
    args = ("--config", "cpu-smoke", "--set", f"workload.model={path}:PlainNet", "--out", str(out))
    assert run_cli(*args, "--plan-only") == 0   # writes config.toml and env.json, launches nothing
    assert run_cli(*args, "--plan-only", "--resume") == 0
    path.write_text(PLAIN_MODEL + "\n# edited\n")
    capsys.readouterr()
    assert run_cli(*args, "--plan-only", "--resume") == 2
    err = capsys.readouterr().err
    assert "--resume" in err and str(path) in err and "changed since the run recorded it" in err


# ---- the example's FLOP formula, hand-worked and against torch's counter ----------------------------

def test_example_flops_by_hand_and_against_the_counter():
    workload = get_workload(f"{REPO / EXAMPLE}:GRUClassifier", "tiny", WorkloadOptions(fixed_length=False))
    # tiny: embed 32, hidden 64, 2 layers, 4 classes, width 16. Per position: layer 0 3·64·(32+64) = 18,432,
    # layer 1 3·64·(64+64) = 24,576 MACs; head 64·4 = 256. Forward 16·43,008 + 256 = 688,384 MACs; × 6.
    assert workload.train_flops_per_sample() == 6 * 688_384 == 4_130_304
    torch.manual_seed(0)
    model = workload.build_model()
    batch = workload.make_dataset(32, torch.device("cpu"), seed=0).batch(torch.arange(5))
    assert workload.tokens_in_batch(batch) == int(batch["lengths"].sum()) < 5 * 16   # pads not counted
    with FlopCounterMode(display=False) as counter:
        workload.loss(model, batch).backward()
    h0_grads = 2 * 3 * 64 * 64 * 2   # per sample: each layer's zero initial state gets no gradient
    assert counter.get_total_flops() == 5 * (workload.train_flops_per_sample(batch) - h0_grads)


# A user model laid out as Hugging Face's is (its blocks in an nn.ModuleList one level down:
# model.model.layers) or, as size "flat", as torchtitan's is (model.layers), beside an embedding and a head.
LAYERED_MODEL = '''
import torch
from torch import nn
from bench.workloads import SyntheticDataset, Workload


class Tokens(SyntheticDataset):
    def __init__(self, n, device, seed):
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 32, (n, 8), generator=gen).to(device)

    def __len__(self):
        return self.ids.shape[0]

    def batch(self, indices):
        return {"ids": self.ids[indices.to(self.ids.device)]}


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


class Layered(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.model = Body()
        self.head = nn.Linear(16, 32)

    def forward(self, ids):
        return self.head(self.model(self.embed(ids)))


class Flat(nn.Module):
    """torchtitan's layout: the layers' container a direct child of the root."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(16, 32)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


class LayeredLM(Workload):
    def build_model(self):
        return Flat() if self.size == "flat" else Layered()

    def make_dataset(self, num_samples, device, seed):
        return Tokens(num_samples, device, seed)

    def loss(self, model, batch):
        logits = model(batch["ids"])
        return nn.functional.cross_entropy(logits.reshape(-1, 32), batch["ids"].reshape(-1))
'''


@pytest.mark.parametrize("size", ["tiny", "flat"])
def test_fsdp2_shards_a_user_models_blocks_in_a_module_list(tmp_path, one_rank_group, size):
    """fully_shard refuses an nn.ModuleList ("does not support containers that do not implement forward"),
    and the default blocks were the model's direct children: a model whose layers' ModuleList is a direct
    child (torchtitan's layout, "flat") failed under fsdp2, and one whose layers sit a level down (Hugging
    Face's) was sharded as one block. Its blocks are now each layer (then the root), as torchtitan shards
    them, and the cell trains."""
    from torch.distributed.fsdp import FSDPModule

    from bench.worker.trainer import Trainer

    spec = f"{write(tmp_path / 'layered.py', LAYERED_MODEL)}:LayeredLM"
    workload = get_workload(spec, size)
    model = workload.build_model()
    layers = model.layers if size == "flat" else model.model.layers
    assert all(b is layer for b, layer in zip(workload.blocks(model), layers, strict=True))
    config = load_config("cpu-smoke", [f"workload.model={spec}", f"workload.model_size={size}",
                                       "matrix.engine=fsdp2", "matrix.world_size=1", "matrix.grad_accum=1",
                                       "matrix.scaling=strong", "matrix.reshard_after_forward=true"])
    (cell,) = expand(config)
    trainer = Trainer(cell, config, torch.device("cpu"), 0, 1, 2)
    assert sum(isinstance(m, FSDPModule) for m in trainer.model.modules()) == 3 + 1  # each layer, the root
    for _ in range(2):
        assert torch.isfinite(trainer.step())
