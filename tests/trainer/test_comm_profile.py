"""Exposed-communication measurement (btk_trainer.comm_profile): interval arithmetic, event classification.

The classification runs on hand-made profiler events (a CUDA trace cannot be recorded here)
and on a real 2-rank gloo run of the trainer on CPU; this file is also that run's launcher:

    python tests/trainer/test_comm_profile.py WORKDIR
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from btk_trainer.comm_profile import (
    CommunicationTime,
    classify_events,
    communication_per_step,
    communication_time,
    merge,
)
from hypothesis import given
from hypothesis import strategies as st
from torch._C._autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

# --- interval arithmetic -------------------------------------------------------------------------------------


def test_disjoint_communication_without_compute_is_all_exposed() -> None:
    assert communication_time([(0, 1), (2, 4)], []) == CommunicationTime(total=3, exposed=3)


def test_overlapping_and_nested_communication_counts_once() -> None:
    assert communication_time([(0, 2), (1, 3)], []).total == 3
    assert communication_time([(0, 10), (2, 3), (9, 10)], []).total == 10


def test_communication_inside_compute_is_hidden() -> None:
    assert communication_time([(2, 3), (4, 5)], [(0, 10)]) == CommunicationTime(total=2, exposed=0)
    # compute in abutting pieces covers it just the same
    assert communication_time([(0, 2)], [(1, 2), (0, 1)]).exposed == 0


def test_partly_overlapped_communication_exposes_the_rest() -> None:
    # hidden: 2..6 (two overlapping compute intervals) and 8..10; exposed: 0..2 and 6..8
    assert communication_time([(0, 10)], [(3, 6), (2, 4), (8, 12)]) == CommunicationTime(total=10, exposed=4)


def test_compute_outside_communication_changes_nothing() -> None:
    assert communication_time([(5, 7)], [(0, 5), (7, 9)]) == CommunicationTime(total=2, exposed=2)


def test_no_communication_is_zero() -> None:
    assert communication_time([], []) == CommunicationTime(total=0, exposed=0)
    assert communication_time([], [(0, 5)]) == CommunicationTime(total=0, exposed=0)


def test_empty_and_reversed_intervals_are_dropped() -> None:
    assert merge([(3, 3), (5, 4), (0, 1)]) == [(0, 1)]
    assert communication_time([(3, 3), (5, 4)], [(0, 1)]) == CommunicationTime(total=0, exposed=0)


def test_merge_sorts_and_joins() -> None:
    assert merge([(6, 8), (0, 2), (1, 3), (3, 4), (10, 11)]) == [(0, 4), (6, 8), (10, 11)]


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8)


@given(intervals, intervals)
def test_matches_counting_unit_cells(communication: list[tuple[int, int]], compute: list[tuple[int, int]]) -> None:
    """On integer intervals the result equals counting the unit cells [t, t+1) each set covers."""

    def cells(spans: list[tuple[int, int]]) -> set[int]:
        return {t for start, end in spans for t in range(start, end)}

    talking, working = cells(communication), cells(compute)
    assert communication_time(communication, compute) == CommunicationTime(
        total=len(talking), exposed=len(talking - working))


def test_per_step_seconds_divide_by_steps() -> None:
    events = [_event("gloo:all_gather", 9, 0, 3_000), _event("aten::mm", 1, 1_000, 2_000)]
    assert communication_per_step(events, 2) == pytest.approx(
        {"communication_total": 1.5e-3, "communication_exposed": 1e-3})
    with pytest.raises(ValueError, match="0 steps"):
        communication_per_step(events, 0)


# --- event classification on hand-made traces -----------------------------------------------------------------


def _event(name: str, thread: int, start: float, end: float, *, device: DeviceType = DeviceType.CPU,
           activity: str | None = None, annotation: bool = False) -> FunctionEvent:
    return FunctionEvent(id=0, name=name, thread=thread, start_us=start, end_us=end, device_type=device,
                         activity_type=activity, is_user_annotation=annotation)


def _with_parents(events: list[FunctionEvent]) -> list[FunctionEvent]:
    """Nest the CPU events by time on each thread, as ``profile.events()`` does."""
    from torch.autograd.profiler_util import EventList

    listed = EventList(events)
    listed._populate_cpu_children()
    return list(listed)


def test_cuda_trace_nccl_kernels_are_communication_other_device_work_compute() -> None:
    cuda = DeviceType.CUDA
    events = [
        _event("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 7, 0, 10, device=cuda,
               activity="kernel"),
        _event("sm90_xmma_gemm_bf16bf16_bf16f32", 8, 2, 5, device=cuda, activity="kernel"),
        _event("Memcpy DtoD (Device -> Device)", 8, 5, 6, device=cuda, activity="gpu_memcpy"),
        _event("Memset (Device)", 8, 12, 13, device=cuda, activity="gpu_memset"),
        # a record_function range mirrored on the device timeline is no work: it would hide everything
        _event("ProfilerStep#2", 8, 0, 20, device=cuda, activity="gpu_user_annotation", annotation=True),
        # host side: NCCL's enqueue annotation and the ops launching kernels are not device time
        _event("nccl:all_gather", 1, 0, 20, activity="user_annotation", annotation=True),
        _event("aten::mm", 1, 0, 20, activity="cpu_op"),
        # the CPU-side gloo group of a CUDA run (stop agreement) is communication too
        _event("gloo:all_reduce", 3, 30, 31, activity="user_annotation", annotation=True),
    ]
    communication, compute = classify_events(_with_parents(events))
    assert sorted(communication) == [(0, 10), (30, 31)]
    assert sorted(compute) == [(2, 5), (5, 6), (12, 13)]
    assert communication_time(communication, compute) == CommunicationTime(total=11, exposed=7)


def test_cpu_trace_gloo_spans_are_communication_training_thread_ops_compute() -> None:
    events = [
        _event("ProfilerStep#2", 1, 0, 100, activity="user_annotation", annotation=True),
        _event("aten::mm", 1, 0, 20, activity="cpu_op"),
        # an FSDP all-gather: the training thread blocks in the c10d call (not compute, though under an
        # aten op here), while gloo's worker thread runs the collective and its own copies
        _event("aten::wrapper_waiting", 1, 20, 60, activity="cpu_op"),
        _event("c10d::_allgather_base_", 1, 21, 59, activity="cpu_op"),
        _event("aten::empty", 1, 21, 22, activity="cpu_op"),
        _event("gloo:all_gather", 5, 25, 55, activity="user_annotation", annotation=True),
        _event("aten::copy_", 5, 50, 54, activity="cpu_op"),
        _event("aten::add", 1, 60, 70, activity="cpu_op"),
        _event("_c10d_functional::wait_tensor", 1, 70, 80, activity="cpu_op"),
        _event("gloo:all_reduce", 6, 66, 78, activity="user_annotation", annotation=True),
    ]
    communication, compute = classify_events(_with_parents(events))
    assert sorted(communication) == [(25, 55), (66, 78)]
    assert sorted(compute) == [(0, 20), (21, 22), (60, 70)]
    # all of the all-gather waits; the all-reduce is hidden by aten::add until 70
    assert communication_time(communication, compute) == CommunicationTime(total=42, exposed=38)


# --- a real 2-rank gloo run of the trainer -------------------------------------------------------------------

PROFILED_STEPS = 2


def _rank(rank: int, world: int, port: int, workdir: str) -> None:
    """One rank: train the tiny job under the profiler, write what the classification made of the trace."""
    import torch
    import torch.distributed as dist
    from btk_trainer.comm_profile import UNRECORDED_STEPS, profile_steps
    from btk_trainer.train import RunConfig, train
    from trainer_fixtures import tiny_spec

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        events, recorded = profile_steps(
            lambda on_step_end: train(RunConfig(spec=tiny_spec(), max_steps=UNRECORDED_STEPS + PROFILED_STEPS,
                                                device="cpu", on_step_end=on_step_end)),
            steps=PROFILED_STEPS, on_gpu=False)
        communication, compute = classify_events(events)
        gloo = [event for event in events if event.name.startswith("gloo:")]
        training_threads = {event.thread for event in events if event.name.startswith("ProfilerStep")}
        result = {
            "recorded": recorded,
            "per_step": communication_per_step(events, recorded),
            "communication_intervals": len(communication),
            "gloo_events": len(gloo),
            "gloo_names": sorted({event.name for event in gloo}),
            "gloo_on_training_thread": any(event.thread in training_threads for event in gloo),
            "compute_intervals": len(compute),
            "fsdp_all_gathers": sum(event.name.startswith("FSDP::all_gather (") for event in events),
        }
        (Path(workdir) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("comm_profile")
    # Run as a script, outside pytest: its pythonpath setting must come through the environment.
    here = Path(__file__).resolve().parent
    pythonpath = os.pathsep.join(str(path) for path in (here.parents[1] / "containers", here.parents[1], here))
    completed = subprocess.run([sys.executable, __file__, str(workdir)], capture_output=True, text=True,
                               timeout=180, check=False,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_fsdp_gloo_run_has_communication_some_of_it_exposed(gloo_run: list[dict[str, Any]]) -> None:
    for rank in gloo_run:
        assert rank["recorded"] == PROFILED_STEPS
        total, exposed = rank["per_step"]["communication_total"], rank["per_step"]["communication_exposed"]
        assert total > 0  # FSDP2 on 2 ranks all-gathers and reduce-scatters every step
        assert 0 <= exposed <= total
        # gloo blocks the training thread until a collective is done: that wait is not compute
        assert exposed > 0


@pytest.mark.slow
def test_fsdp_gloo_run_classification(gloo_run: list[dict[str, Any]]) -> None:
    for rank in gloo_run:
        assert rank["fsdp_all_gathers"] > 0
        assert rank["communication_intervals"] == rank["gloo_events"] >= rank["fsdp_all_gathers"]
        assert {"gloo:all_gather", "gloo:all_reduce"} <= set(rank["gloo_names"])
        assert not rank["gloo_on_training_thread"]  # gloo's worker threads, not the training thread
        assert rank["compute_intervals"] > 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    import torch.multiprocessing as mp
    from trainer_fixtures import RANK_START_METHOD

    mp.start_processes(_rank, args=(2, _free_port(), sys.argv[1]), nprocs=2, start_method=RANK_START_METHOD)
