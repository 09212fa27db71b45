"""Packing: a world size smaller than the node runs in several launches at once, each on its own GPUs and
its own CPUs (run.pack), so that an 8-GPU node measures eight 1-GPU shares of the cells at a time, four
2-GPU ones, two 4-GPU ones, rather than one while seven GPUs wait.

What the launches at once share, and how it is held:
- **GPUs**: none. A slot is a block of `ws` consecutive GPUs (CUDA_VISIBLE_DEVICES, indices into the
  user's own CUDA_VISIBLE_DEVICES when set): consecutive so that a 2- or 4-GPU slot stays under one PCIe
  switch or NVLink island on boards that have them.
- **Host CPUs**: split. Each slot's launch (torchrun and its ranks) runs on its own equal share of the
  launcher's CPUs (its affinity mask), and its ranks' threads are sized from that share: every rank has the
  CPUs a rank of the full node has (CPUs ÷ GPUs), at every world size. Unpacked, a 1-GPU cell's rank would
  have the whole host, and the scaling from it would compare unlike hosts.
- **PCIe, host memory bandwidth, NVLink/NVSwitch, power and clocks**: shared, not controlled. The cells
  here keep their data on the device (synthetic batches), so PCIe carries little; on NVSwitch systems
  disjoint GPU sets have their own links; a node busy on every GPU is the power and thermal state of the
  largest world size's cells, which the scaling compares against. Each row records the launches it ran
  beside (`packed_launches`) and its GPUs (`slot_gpus`), so any of this can be looked for.
- **Between slots**: different GPUs of the same model differ by a few % in clocks. Cells stepped side by
  side stay in one slot (a slot takes whole groups: bench/worker/groups.py, or whole recipes in a race), so
  every paired comparison (speed_vs_torch, a race's eliminations) is on one GPU set; comparisons across
  groups were unpaired already. With run.launches > 1 each repeat rotates the shares over the slots.

`auto` packs on CUDA only. On a CPU a slot is `ws` × run.threads_per_rank cores (`on` only): CPU ranks of
launches at once share the memory bandwidth and caches, which a GPU's do not.

This module owns the node's side (its GPUs and CPUs, each slot's environment and affinity); how many slots
and which cells each takes is the pure scheduler's (bench/run/schedule.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from bench.run.schedule import slot_count


@dataclass(frozen=True)
class Slot:
    """Where one of a world size's launches at once runs: its GPUs (visible-device ids; empty on CPU), its
    CPUs (the launcher's affinity ids; empty: unchanged) and how many launches run at once (`of`: the
    slots, or fewer when a world size has fewer units than slots: schedule.lanes)."""

    index: int
    of: int
    gpus: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """What the slot's launch adds to its environment: its GPUs, when packed."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus and self.of > 1 else {}

    def enter(self) -> None:
        """In the launch's child before exec (preexec_fn): bind it, and so its ranks, to the slot's CPUs."""
        if self.cpus and self.of > 1:
            os.sched_setaffinity(0, self.cpus)

    def facts(self) -> dict:
        """The row's record of it (bench/schema.py: packed_launches, slot_gpus)."""
        return {"packed_launches": self.of, "slot_gpus": ",".join(self.gpus) if self.gpus else None}


ALONE = Slot(0, 1)


def launcher_cpus() -> list[int]:
    """The CPUs the launcher may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def visible_gpus(gpus: int, environ: dict[str, str] | None = None) -> list[str]:
    """The ids a launch may name in CUDA_VISIBLE_DEVICES: the user's own list when set (its first `gpus`),
    else 0 … gpus − 1."""
    env = os.environ if environ is None else environ
    own = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return own[:gpus] if own else [str(i) for i in range(gpus)]


def launches_at_once(run, ws: int, gpus: int) -> int:
    """schedule.slot_count for a run's settings (config.run: pack, device, threads_per_rank) on this
    launcher's CPUs: what the sweep (`slots`), the estimate and --dry-run all count with."""
    return slot_count(run.pack, run.device, ws, gpus, len(launcher_cpus()), run.threads_per_rank)


def slots(pack: str, device: str, ws: int, gpus: int, threads_per_rank: int,
          cpus: Sequence[int] | None = None, environ: dict[str, str] | None = None) -> list[Slot]:
    """The slots of world size `ws` on this node: schedule.slot_count of them, slot i on the i-th block of
    ws GPUs and the i-th equal share of the CPUs (hand-worked in tests/test_packing.py)."""
    cpus = list(launcher_cpus() if cpus is None else cpus)
    n = slot_count(pack, device, ws, gpus, len(cpus), threads_per_rank)
    if n == 1:
        return [ALONE]
    ids = visible_gpus(gpus, environ) if device == "cuda" else []
    share = len(cpus) // n
    return [Slot(i, n, tuple(ids[i * ws:(i + 1) * ws]), tuple(cpus[i * share:(i + 1) * share]))
            for i in range(n)]


def threads_per_rank(slot: Slot, ws: int, threads_per_rank: int, ranks_cpus: int) -> int:
    """run.threads_per_rank, or the CPUs the launch may use (its slot's, packed) ÷ its ranks."""
    cpus = len(slot.cpus) if slot.of > 1 and slot.cpus else ranks_cpus
    return threads_per_rank or max(1, cpus // ws)
