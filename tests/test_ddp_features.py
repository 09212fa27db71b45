"""ddp_core features, one world-size-2 spawn for all of them (spawns cost seconds each).

Each check below runs on both ranks inside one process group and returns None or a message; the
module fixture collects them, and one pytest test per check asserts its own result, so a failure
names the feature (and the combination) that broke.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import traceback

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_distributed
from torch import nn

from ddp_core import DistributedDataParallel

STRATEGIES = ("naive", "bucketed", "overlap")
RTOL, ATOL = 1e-5, 1e-6  # float32, different summation orders: see test_ddp_parity.py
WORLD = 2


def mlp(seed=0, *extra):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), *extra)


def global_batch(n, seed=1, out=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=gen), torch.randn(n, out, generator=gen)


def local(t, rank, world_size):
    per = len(t) // world_size
    return t[rank * per : (rank + 1) * per]


def assert_close_models(tag, a, b, rtol=RTOL, atol=ATOL):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        if not torch.allclose(pa, pb, rtol=rtol, atol=atol):
            raise AssertionError(f"{tag}: {name} max|diff|={(pa - pb).abs().max().item():.3g}")


def same_on_all_ranks(t) -> bool:
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


# ---- checks (each runs on every rank) -------------------------------------------------------------------


def check_no_sync_accumulation(rank, ws):
    """K micro-steps (K-1 under no_sync, loss/K) + the synced one == one step on the K-times batch."""
    k = 3
    x, y = global_batch(4 * ws * k)
    for strategy in STRATEGIES:
        for as_view in (False, True):
            ref = mlp()
            ddp = DistributedDataParallel(
                copy.deepcopy(ref), strategy=strategy, bucket_cap_mb=0.001, gradient_as_bucket_view=as_view
            )
            for model in (ref, ddp):
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                opt.zero_grad()
                if model is ref:
                    nn.functional.mse_loss(model(x), y).backward()
                else:
                    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
                        xm, ym = local(xm, rank, ws), local(ym, rank, ws)
                        if i < k - 1:
                            with model.no_sync():
                                (nn.functional.mse_loss(model(xm), ym) / k).backward()
                        else:
                            (nn.functional.mse_loss(model(xm), ym) / k).backward()
                opt.step()
            assert_close_models(f"strategy={strategy} view={as_view}", ddp.module, ref)


def check_comm_dtype(rank, ws):
    """fp16/bf16 all-reduce stays within ws·eps of the fp32 one (eps: fp16 2^-10, bf16 2^-7).

    Each rank's g/ws is rounded once to the wire format (≤ eps/2 relative) and each of the ws-1
    additions rounds once more (≤ eps/2 of a partial sum ≤ max|g|): at most ws·eps·max|g| in all.
    The absolute floor is scaled by the tensor's max so fp16 subnormals of tiny entries pass.
    """
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    grads = {}
    for comm_dtype in (None, torch.float16, torch.bfloat16):
        for strategy in STRATEGIES:
            ddp = DistributedDataParallel(
                mlp(), strategy=strategy, bucket_cap_mb=0.001, comm_dtype=comm_dtype
            )
            nn.functional.mse_loss(ddp(x), y).backward()
            grads[comm_dtype, strategy] = [p.grad.clone() for p in ddp.parameters()]
            assert all(p.grad.dtype == torch.float32 for p in ddp.parameters()), "grad dtype changed"
    for comm_dtype, eps in ((torch.float16, 2.0**-10), (torch.bfloat16, 2.0**-7)):
        for strategy in STRATEGIES:
            for g, g32 in zip(grads[comm_dtype, strategy], grads[None, strategy]):
                tol = ws * eps * g32.abs().max().item()
                err = (g - g32).abs().max().item()
                assert err <= tol, f"comm_dtype={comm_dtype} strategy={strategy}: err {err:.3g} > {tol:.3g}"
            assert not all(
                torch.equal(a, b) for a, b in zip(grads[comm_dtype, strategy], grads[None, strategy])
            ), f"comm_dtype={comm_dtype} strategy={strategy} is bit-identical to fp32: not compressed?"


def check_batchnorm_buffers(rank, ws):
    """Buffers come from rank 0 before every forward; params and buffers track torch DDP's."""
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws) + rank, local(y, rank, ws)  # shifted per rank: local BN stats differ
    for strategy in STRATEGIES:
        base = mlp(0, nn.BatchNorm1d(3))
        ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy)
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
        for model in (ours, theirs):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        assert_close_models(f"strategy={strategy}", ours.module, theirs.module)
        for (name, a), b in zip(ours.module.named_buffers(), theirs.module.buffers()):
            assert torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL), (
                f"strategy={strategy} buffer {name}"
            )
        bn = ours.module[-1]
        with torch.no_grad():
            bn.running_mean.fill_(float(rank))
        ours.eval()(x)  # eval: the forward itself leaves the stats alone; only the broadcast changes them
        assert same_on_all_ranks(bn.running_mean), f"strategy={strategy}: running_mean not broadcast"


def check_frozen_parameters(rank, ws):
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy in STRATEGIES:
        base = mlp()
        base[0].weight.requires_grad_(False)
        ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy, bucket_cap_mb=0.001)
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.001)
        assert "0.weight" not in sum(ours.bucket_param_names, []), (
            f"strategy={strategy}: frozen weight bucketed"
        )
        for model in (ours, theirs):
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        assert ours.module[0].weight.grad is None, f"strategy={strategy}: frozen weight got a grad"
        assert_close_models(f"strategy={strategy}", ours.module, theirs.module)


class WithUnused(nn.Module):
    """`never` is used by no forward; `rank0_only` only by rank 0's (locally unused elsewhere)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.never, self.rank0_only, self.b = (
            nn.Linear(8, 16),
            nn.Linear(16, 16),
            nn.Linear(16, 16),
            nn.Linear(16, 3),
        )

    def forward(self, x, use_rank0_only=False):
        h = torch.relu(self.a(x))
        if use_rank0_only:
            h = h + self.rank0_only(h)
        return self.b(h)


def check_find_unused_true(rank, ws):
    """Buckets complete with zeros for unused parameters; parameters match torch DDP's."""
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy, cap, as_view in itertools.product(STRATEGIES, (0.001, 25), (False, True)):
        base = WithUnused()
        ours = DistributedDataParallel(
            copy.deepcopy(base),
            strategy=strategy,
            bucket_cap_mb=cap,
            find_unused_parameters=True,
            gradient_as_bucket_view=as_view,
        )
        theirs = nn.parallel.DistributedDataParallel(
            copy.deepcopy(base), bucket_cap_mb=cap, find_unused_parameters=True
        )
        for model in (ours, theirs):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no weight decay: None and 0 grads agree
            for _ in range(2):
                opt.zero_grad()
                nn.functional.mse_loss(model(x, use_rank0_only=rank == 0), y).backward()
                opt.step()
        assert_close_models(f"strategy={strategy} cap={cap} view={as_view}", ours.module, theirs.module)
        assert same_on_all_ranks(ours.module.rank0_only.weight.detach()), f"strategy={strategy}: diverged"


def check_find_unused_keeps_none_like_torch_under_adamw(rank, ws):
    """A parameter no rank uses keeps grad=None, as torch's reducer leaves it (copy_bucket_to_grad with
    global_unused); AdamW with weight decay then skips it, so its values and moments stay equal to torch
    DDP's. With accumulation: `rank0_only` used only under no_sync on rank 0 and never in the synced
    micro-step is globally unused too, so it keeps its local gradient (torch does not touch it)."""
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy, cap, as_view, accum in itertools.product(STRATEGIES, (0.001, 25), (False, True), (1, 2)):
        base = WithUnused()
        ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy, bucket_cap_mb=cap,
                                       find_unused_parameters=True, gradient_as_bucket_view=as_view)
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap,
                                                     find_unused_parameters=True,
                                                     gradient_as_bucket_view=as_view)
        tag = f"strategy={strategy} cap={cap} view={as_view} accum={accum}"
        for model in (ours, theirs):
            opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                for k in range(accum):
                    synced = k == accum - 1
                    with contextlib.nullcontext() if synced else model.no_sync():
                        loss = nn.functional.mse_loss(model(x, use_rank0_only=rank == 0 and not synced), y)
                        loss.backward()
                assert model.module.never.weight.grad is None, f"{tag}: never-used weight got a gradient"
                opt.step()
        assert_close_models(tag, ours.module, theirs.module)
        for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
            ga, gb = a.grad, b.grad
            assert (ga is None) == (gb is None), f"{tag}: {name} grad None={ga is None}, torch's={gb is None}"


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3))


def check_channels_last_gradients_keep_the_parameters_layout(rank, ws):
    """channels_last convolutions (NVIDIA's ResNet-50 recipe layout): gradients have the parameters'
    strides in both modes (torch's initialize_bucket_views), autograd never warns about the gradient
    layout contract, view-mode gradients live inside their bucket, and values equal torch DDP's."""
    import warnings

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4 * ws, 3, 6, 6, generator=gen).to(memory_format=torch.channels_last)
    y = torch.randn(4 * ws, 3, generator=gen)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy, as_view in itertools.product(STRATEGIES, (False, True)):
        base = conv_net().to(memory_format=torch.channels_last)
        ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy, bucket_cap_mb=0.001,
                                       gradient_as_bucket_view=as_view)
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=0.001,
                                                     gradient_as_bucket_view=as_view)
        tag = f"strategy={strategy} view={as_view}"
        for model in (ours, theirs):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad(set_to_none=False)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    nn.functional.mse_loss(model(x), y).backward()
                layout = [str(w.message) for w in caught if "layout contract" in str(w.message)]
                assert not layout, f"{tag}: {layout[0]}"
                opt.step()
        assert_close_models(tag, ours.module, theirs.module)
        for name, p in ours.module.named_parameters():
            assert p.grad.stride() == p.stride(), f"{tag}: {name} grad {p.grad.stride()} != {p.stride()}"
        if as_view and strategy != "naive":
            storages = {b.flat.untyped_storage().data_ptr() for b in ours.buckets}
            assert all(p.grad.untyped_storage().data_ptr() in storages for p in ours.module.parameters()), tag


def check_find_unused_false_raises(rank, ws):
    """An unused parameter (the same on every rank) raises a RuntimeError naming it; no hang."""
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy in STRATEGIES:
        for cap in (0.001, 25):
            ddp = DistributedDataParallel(WithUnused(), strategy=strategy, bucket_cap_mb=cap)
            try:
                nn.functional.mse_loss(ddp(x), y).backward()
            except RuntimeError as e:
                assert "never.weight" in str(e) and "find_unused_parameters=True" in str(e), str(e)
            else:
                raise AssertionError(f"strategy={strategy} cap={cap}: no error for an unused parameter")
            dist.barrier()  # the group is still usable: every launched all-reduce was waited for


def check_exception_inside_no_sync(rank, ws):
    ddp = DistributedDataParallel(mlp())
    try:
        with ddp.no_sync():
            assert ddp.require_backward_grad_sync is False
            raise KeyError("boom")
    except KeyError:
        pass
    assert ddp.require_backward_grad_sync is True, "no_sync left sync disabled after an exception"


def check_zero_grad_modes_with_bucket_view(rank, ws):
    """gradient_as_bucket_view keeps working across steps whichever way zero_grad clears grads."""
    x, y = global_batch(4 * ws)
    for strategy in ("bucketed", "overlap"):
        for set_to_none in (True, False):
            ref = mlp()
            ddp = DistributedDataParallel(
                copy.deepcopy(ref), strategy=strategy, bucket_cap_mb=0.001, gradient_as_bucket_view=True
            )
            opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, ddp)]
            for step in range(4):
                for model, opt in zip((ref, ddp), opts):
                    opt.zero_grad(set_to_none=set_to_none)
                    xs, ys = (x, y) if model is ref else (local(x, rank, ws), local(y, rank, ws))
                    nn.functional.mse_loss(model(xs), ys).backward()
                    opt.step()
                tag = f"strategy={strategy} set_to_none={set_to_none} step={step}"
                assert_close_models(tag, ddp.module, ref)
                for p, bucket_view in ((p, v) for b in ddp.buckets for p, v in zip(b.params, b.views)):
                    assert p.grad.data_ptr() == bucket_view.data_ptr(), f"{tag}: .grad is not the bucket view"


def check_autocast_grad_scaler(rank, ws):
    """autocast(bf16) + GradScaler on top: the scaler unscales after the sync, as with torch DDP."""
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for strategy in STRATEGIES:
        base = mlp()
        ours = DistributedDataParallel(copy.deepcopy(base), strategy=strategy)
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(base))
        for model in (ours, theirs):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            for _ in range(2):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = nn.functional.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        # same bf16 forward on both; the reductions agree to float32 ulps
        assert_close_models(f"strategy={strategy}", ours.module, theirs.module)
        assert all(torch.isfinite(p).all() for p in ours.parameters())


def check_init_sync(rank, ws):
    """verify raises on differently seeded replicas; none lets them diverge; broadcast keeps them equal."""
    try:
        DistributedDataParallel(mlp(seed=rank), init_sync="verify")
    except ValueError as e:
        assert "0.weight" in str(e) and "torch.manual_seed" in str(e), str(e)
    else:
        raise AssertionError("init_sync='verify' accepted differently seeded replicas")
    DistributedDataParallel(mlp(seed=0), init_sync="verify")  # identical replicas pass
    x, y = global_batch(4 * ws)
    x, y = local(x, rank, ws), local(y, rank, ws)
    for init_sync, expect_same in (("none", False), ("broadcast", True)):
        ddp = DistributedDataParallel(mlp(seed=rank), init_sync=init_sync)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        same = all(same_on_all_ranks(p.detach()) for p in ddp.parameters())
        assert same == expect_same, f"init_sync={init_sync}: replicas identical={same}"


def check_profiler_labels_and_wait_time(rank, ws):
    x, y = global_batch(4 * ws)
    for strategy, expected in (
        ("naive", "ddp_core.allreduce.param.0.weight"),
        ("bucketed", "ddp_core.allreduce.bucket0"),
        ("overlap", "ddp_core.allreduce.bucket0"),
    ):
        ddp = DistributedDataParallel(mlp(), strategy=strategy, bucket_cap_mb=0.001)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            nn.functional.mse_loss(ddp(local(x, rank, ws)), local(y, rank, ws)).backward()
        names = {e.name for e in prof.events()}
        for label in ("ddp_core.forward", expected, "ddp_core.wait", "c10d::allreduce_"):
            assert label in names, f"strategy={strategy}: no {label!r} in the trace"
        assert isinstance(ddp.last_sync_wait_ms, float) and ddp.last_sync_wait_ms >= 0


def check_bucket_layout(rank, ws):
    """Buckets in reverse registration order, parameters never split, first_bucket_mb honoured."""
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10))  # 40000, 400, 4000, 40 bytes
    names = ["1.bias", "1.weight", "0.bias", "0.weight"]
    # cap 0.001 MiB = 1048 bytes, torch's rule: a bias joins the open bucket, its weight passes the cap
    tiny = DistributedDataParallel(model, strategy="overlap", bucket_cap_mb=0.001)
    assert tiny.bucket_param_names == [names[:2], names[2:]], tiny.bucket_param_names
    assert tiny.bucket_sizes_bytes == [4040, 40400], tiny.bucket_sizes_bytes
    one = DistributedDataParallel(model, strategy="bucketed", bucket_cap_mb=25)
    assert one.bucket_param_names == [names] and one.bucket_sizes_bytes == [44440], one.bucket_param_names
    first = DistributedDataParallel(
        model, strategy="bucketed", bucket_cap_mb=25, first_bucket_mb=4040 / 2**20
    )
    assert first.bucket_param_names == [names[:2], names[2:]], first.bucket_param_names


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


def run_all_checks(rank, world_size) -> dict[str, str | None]:
    results = {}
    for name, check in CHECKS.items():
        try:
            check(rank, world_size)
            results[name] = None
        except Exception:  # noqa: BLE001 - reported per check in the parent
            results[name] = traceback.format_exc()
        dist.barrier()
    return results


@pytest.fixture(scope="module")
def results():
    return run_distributed(run_all_checks, WORLD, timeout_s=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_feature(results, check):
    failed = {rank: r[check] for rank, r in enumerate(results) if r[check] is not None}
    assert not failed, "\n".join(f"rank {rank}:\n{tb}" for rank, tb in failed.items())


def test_bad_arguments_are_named():
    """Validation happens before any collective, so no process group is needed here."""
    for kwargs, word in (
        ({"init_sync": "maybe"}, "maybe"),
        ({"strategy": "ring"}, "ring"),
        ({"comm_dtype": torch.float64}, "float64"),
    ):
        with pytest.raises(ValueError, match=word):
            DistributedDataParallel(nn.Linear(2, 2), **kwargs)


def test_options_are_one_value_checked_in_one_place():
    """The keywords are Options' fields; an Options value is checked when it is made, before any
    collective."""
    from ddp_core import Options

    with pytest.raises(ValueError, match="ring"):
        Options(strategy="ring")
    with pytest.raises(TypeError, match="Options value"):
        DistributedDataParallel(nn.Linear(2, 2), "bucketed")  # a strategy given by position is refused
    with pytest.raises(ValueError, match="maybe"):  # keywords beside an Options value are checked too
        DistributedDataParallel(nn.Linear(2, 2), Options(strategy="naive"), init_sync="maybe")


def fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one broke")
    return rank


@pytest.mark.timeout(60)
def test_run_distributed_reports_the_failing_rank_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed.*fail_on_rank_one.*rank one broke"):
        run_distributed(fail_on_rank_one, 2)


def test_used_parameters_walks_the_graph_through_nested_outputs():
    """find_unused_parameters' graph walk, in-process: tensors nested in dicts/tuples are followed."""
    from ddp_core.graph import used_parameters

    model = WithUnused()
    h = model.a(torch.randn(2, 8))
    used = used_parameters({"logits": (model.b(h),), "aux": None})
    names = {n for n, p in model.named_parameters() if id(p) in used}
    assert names == {"a.weight", "a.bias", "b.weight", "b.bias"}


def test_labels_cost_nothing_without_a_profiler():
    from ddp_core import labels

    assert labels.label("ddp_core.wait") is labels._OFF  # no profiler: the shared no-op, nothing entered
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with labels.label("ddp_core.test_label"):
            torch.ones(1).add_(1)
    assert "ddp_core.test_label" in {e.name for e in prof.events()}
