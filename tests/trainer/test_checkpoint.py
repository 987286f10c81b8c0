"""The checkpointer's save policy and the trainer state it carries (the DCP protocol runs in test_distributed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from btk_trainer.checkpoint import Checkpointer, TrainerState
from btk_trainer.data import ResumableSampler


def _checkpointer(root: Path | None, interval: int = 3) -> Checkpointer:
    model = torch.nn.Linear(2, 2)
    sampler = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0)
    return Checkpointer(root, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        state=TrainerState(sampler), interval=interval, keep=2, local_rank=0)


def test_saves_every_interval_and_on_a_stop(tmp_path: Path) -> None:
    checkpointer = _checkpointer(tmp_path, interval=3)
    assert [step for step in range(1, 10) if checkpointer.should_save(step, stop_requested=False)] == [3, 6, 9]
    assert checkpointer.should_save(4, stop_requested=True)


def test_never_saves_one_step_twice(tmp_path: Path) -> None:
    checkpointer = _checkpointer(tmp_path)
    checkpointer.last_saved = 6  # resumed from step 6 (or just saved it)
    assert not checkpointer.should_save(6, stop_requested=True)
    assert checkpointer.should_save(7, stop_requested=True)


def test_without_a_directory_nothing_is_saved() -> None:
    checkpointer = _checkpointer(None)
    assert not any(checkpointer.should_save(step, stop_requested=True) for step in range(1, 10))
    assert checkpointer.resume() is None
    with pytest.raises(RuntimeError, match="no checkpoint directory"):
        checkpointer.save()


def test_trainer_state_round_trip() -> None:
    sampler = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=2, seed=4)
    for _ in range(5):
        sampler.next_indices()
    saved: dict[str, Any] = TrainerState(sampler, step=5).state_dict()
    assert saved == {"step": 5, "sampler": sampler.state_dict()}

    fresh = ResumableSampler(64, micro_batch_size=2, dp_rank=0, dp_size=2, seed=4)
    restored = TrainerState(fresh)
    restored.load_state_dict(saved)
    assert restored.step == 5 and fresh.next_indices() == sampler.next_indices()
