"""The projection model against a published scaling table: NVIDIA's ResNet-50 v1.5 on a DGX A100.

NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance:
NVIDIA DGX A100 (8x A100 80GB)" (pytorch-21.03 NGC container): 1 GPU 938 img/s TF32, 2,470 img/s AMP;
8 GPUs 7,248 and 16,621 img/s. Batch 256 per GPU in both precisions (ConvNets/configs.yml, DGXA100), so
going from 1 to 8 GPUs keeps the per-GPU batch: weak scaling in this suite's terms.

The compute side is the 1-GPU step, 256 / throughput; its split is not published, so backward is taken as
2/3 of it (backward does twice forward's FLOPs), the optimizer as 0, and the backward share is varied to
show how much the answer depends on it. Buckets: the built-in resnet50's trainable parameters (built on
the meta device) grouped by ddp_core.assign_buckets at 25 MiB, fp32 gradients (AMP keeps fp32 parameters,
so DDP reduces fp32 gradients there too), ready uniformly over backward in reverse parameter order.
Network: the a100-nvlink preset, 8 ranks on one node, the cheapest algorithm per bucket.

    PYTHONPATH=. python benchmarks/project_published_resnet50.py
"""

from __future__ import annotations

from bench.project.layout import engine_bucket_sizes, workload_options
from bench.project.network import preset_network
from bench.project.project import uniform_buckets
from bench.project.simulate import Compute, simulate_step

PER_GPU_BATCH = 256
PUBLISHED = {"TF32": (938.0, 7248.0), "AMP": (2470.0, 16621.0)}  # img/s at 1 and 8 GPUs
BACKWARD_SHARES = (0.5, 2 / 3, 0.8)


def main() -> None:
    sizes = engine_bucket_sizes("torch", "resnet", "resnet50", 25.0, "none", workload_options({}))
    buckets = uniform_buckets("torch", sizes, "workload layout")
    net = preset_network("a100-nvlink")
    mib = [round(s / 2**20, 1) for s in sizes]
    print(f"resnet50: {len(sizes)} buckets of {mib} MiB; network {net.label}")
    print(f"{'precision':9} {'bwd share':>9} {'T1 ms':>8} {'T8 ms':>8} {'exposed ms':>10} {'pred img/s':>10} "
          f"{'published':>9} {'error %':>8} {'bottleneck':>10}")
    for precision, (one, eight) in PUBLISHED.items():
        t1 = PER_GPU_BATCH / one * 1e3
        for share in BACKWARD_SHARES:
            compute = Compute(forward_ms=t1 * (1 - share), backward_ms=t1 * share, optimizer_ms=0.0,
                              grad_accum=1, per_rank_batch=PER_GPU_BATCH)
            step = simulate_step(compute, buckets, net, 8)
            predicted = 8 * PER_GPU_BATCH / step.step_ms * 1e3
            print(f"{precision:9} {share:9.2f} {t1:8.1f} {step.step_ms:8.1f} {step.exposed_comm_ms:10.2f} "
                  f"{predicted:10.0f} {eight:9.0f} {100 * (predicted - eight) / eight:+8.1f} "
                  f"{step.bottleneck:>10}")


if __name__ == "__main__":
    main()
