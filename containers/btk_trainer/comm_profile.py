"""How much of a training step's communication is not hidden behind compute, from a ``torch.profiler`` trace.

The benchmark's phase timing (:class:`btk_trainer.train.PhaseTimes`) synchronises the device
at every phase boundary: the collectives FSDP2 and tensor parallelism run inside forward and
backward are folded into those phases, and how much of them overlaps compute is lost. Here a few steps run
unsynchronised under ``torch.profiler``; the trace gives two sets of time intervals,
communication and compute (:func:`classify_events`), and per step (:func:`communication_per_step`):

* **total** communication: the length of the union of the communication intervals;
* **exposed** communication: the part of that union during which no compute runs, the time
  the step waits on communication (what overlapping it would win back).

A run without collectives has both at 0; a 1-process run keeps only its all-reduces over a
group of one (the stop agreement, the non-finite flag, the logged loss).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import torch
from torch._C._autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

Interval = tuple[float, float]

#: Device activities (kineto's activity types) that keep the device busy: kernels and copies/fills.
DEVICE_WORK_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Host-side calls that issue or wait on a collective: an op enclosing one is waiting, not computing.
COLLECTIVE_CALL_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "gloo:", "nccl:",
                            "record_param_comms")
#: Steps of a profiled run before the recorded ones: the run's first step (lazy initialisation,
#: compilation), then one step of profiler warm-up.
UNRECORDED_STEPS = 2


class CommunicationTime(NamedTuple):
    """Communication time, in the unit of the intervals it was computed from."""

    total: float
    exposed: float


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals (empty and reversed ones dropped)."""
    merged: list[Interval] = []
    for start, end in sorted(interval for interval in intervals if interval[1] > interval[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_length(first: Sequence[Interval], second: Sequence[Interval]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists (as :func:`merge` returns)."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        start, end = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        total += max(0.0, end - start)
        if first[i][1] <= second[j][1]:
            i += 1
        else:
            j += 1
    return total


def communication_time(communication: Iterable[Interval], compute: Iterable[Interval]) -> CommunicationTime:
    """Total and exposed communication from (start, end) intervals, in their unit.

    total = length of the union of ``communication``; exposed = total minus the length of that
    union's intersection with the union of ``compute``. Overlapping or nested intervals count
    once; communication fully inside compute is hidden (exposed 0), communication with no
    compute at all is exposed entirely (exposed = total).
    """
    busy_communicating = merge(communication)
    total = sum(end - start for start, end in busy_communicating)
    hidden = overlap_length(busy_communicating, merge(compute))
    return CommunicationTime(total=total, exposed=max(0.0, total - hidden))


def _span(event: FunctionEvent) -> Interval:
    return (float(event.time_range.start), float(event.time_range.end))


def _is_device_work(event: FunctionEvent) -> bool:
    """A kernel, memcpy or memset on the device timeline (not a user annotation mirrored there)."""
    if event.device_type == DeviceType.CPU or event.is_user_annotation:
        return False
    activity = getattr(event, "activity_type", None)
    return activity is None or activity in DEVICE_WORK_ACTIVITIES


def _is_nccl_kernel(event: FunctionEvent) -> bool:
    return _is_device_work(event) and "nccl" in event.name.lower()


def _is_gloo_collective(event: FunctionEvent) -> bool:
    return event.device_type == DeviceType.CPU and event.name.startswith("gloo:")


def _host_compute(events: Sequence[FunctionEvent], gloo_threads: set[int]) -> list[Interval]:
    """``aten::`` ops on threads that run no gloo collective, except ops that enclose a collective call."""
    waiting: set[int] = set()  # id() of ops with a collective call inside (the call blocks them)
    for event in events:
        if event.device_type == DeviceType.CPU and event.name.startswith(COLLECTIVE_CALL_PREFIXES):
            parent = event.cpu_parent
            while parent is not None and id(parent) not in waiting:
                waiting.add(id(parent))
                parent = parent.cpu_parent
    return [
        _span(event) for event in events
        if event.device_type == DeviceType.CPU and event.name.startswith("aten::")
        and event.thread not in gloo_threads and id(event) not in waiting
    ]


def classify_events(events: Iterable[FunctionEvent]) -> tuple[list[Interval], list[Interval]]:
    """(communication, compute) intervals in microseconds from a profile's events (``profile.events()``).

    Communication: device kernels whose name contains "nccl" (any case: NCCL's collective
    kernels, e.g. ``ncclDevKernel_AllGather_RING_LL``), and host events named ``gloo:*``. The
    latter are what ProcessGroupGloo records around each collective's execution on its worker
    threads (``gloo:all_gather``, ``gloo:all_reduce``, FSDP2's reduce-scatter on gloo
    included); on CUDA they are the CPU-side gloo group's collectives (the stop agreement).
    Both spans include waiting for the other ranks, as the time a collective takes does.

    Compute, when the trace holds device work (CUDA): every other kernel, memcpy and memset on
    the device (copies and fills occupy it as kernels do: communication beside them is not
    what the step waits for); user annotations mirrored on the device timeline are not work.
    Without device work (CPU, gloo): the ``aten::`` ops on the threads that run no gloo
    collective (the training thread), except those enclosing a collective call or a wait on
    one (``c10d::*``, ``_c10d_functional::*``): waiting is not computing.

    Limits. On the device, exposed time is communication while no other kernel runs, whatever
    keeps the device idle (a slow host counts too). Off CUDA, Python time between ops counts
    as neither, and the host's hand-over to and from gloo's worker thread is not
    communication: the CPU figures check the plumbing rather than measure a network. The
    profiler's own overhead is in every figure.
    """
    events = list(events)
    communication = [_span(e) for e in events if _is_nccl_kernel(e) or _is_gloo_collective(e)]
    device_compute = [_span(e) for e in events if _is_device_work(e) and not _is_nccl_kernel(e)]
    if device_compute:
        return communication, device_compute
    gloo_threads = {event.thread for event in events if _is_gloo_collective(event)}
    return communication, _host_compute(events, gloo_threads)


def communication_per_step(events: Iterable[FunctionEvent], steps: int) -> dict[str, float]:
    """Seconds per step of total and exposed communication in a profile of ``steps`` steps."""
    if steps <= 0:
        raise ValueError(f"a profile of {steps} steps has no per-step figure")
    time = communication_time(*classify_events(events))
    return {"communication_total": time.total / 1e6 / steps, "communication_exposed": time.exposed / 1e6 / steps}


def profile_steps(run: Callable[[Callable[[int], None]], object], *, steps: int,
                  on_gpu: bool) -> tuple[list[FunctionEvent], int]:
    """The profiler's events over ``steps`` steps of a training run, and how many steps it recorded.

    ``run(on_step_end)`` trains ``UNRECORDED_STEPS + steps`` steps, calling ``on_step_end`` after
    each (:attr:`btk_trainer.train.RunConfig.on_step_end`). The first step is not profiled, the
    second warms the profiler up, the next ``steps`` are recorded: each from the end of one
    optimizer step to the end of the next, nothing synchronised inside them. On the GPU the
    device is drained where recording starts and where it ends, so no kernel of the step before
    is counted and none of the last recorded step is cut off by the end of the trace. Fewer
    steps are recorded when the run stops sooner.
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    recorded = 0
    with profile(activities=activities,
                 schedule=schedule(wait=UNRECORDED_STEPS - 1, warmup=1, active=steps, repeat=1)) as profiler:

        def on_step_end(step: int) -> None:
            nonlocal recorded
            action = profiler.current_action
            if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                recorded += 1
            if on_gpu and action in (ProfilerAction.WARMUP, ProfilerAction.RECORD_AND_SAVE):
                torch.cuda.synchronize()
            profiler.step()

        run(on_step_end)
    return (list(profiler.events()) if recorded else []), recorded


def profile_communication(run: Callable[[Callable[[int], None]], object], *, steps: int,
                          on_gpu: bool) -> dict[str, float]:
    """Per-step communication (:func:`communication_per_step`) of ``steps`` steps of a run (:func:`profile_steps`)."""
    events, recorded = profile_steps(run, steps=steps, on_gpu=on_gpu)
    if not recorded:
        raise RuntimeError(f"the profiled run stopped before step {UNRECORDED_STEPS + 1}: nothing recorded")
    return communication_per_step(events, recorded)
