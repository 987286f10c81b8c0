"""What a stop's checkpoint writes, and how fast each node must write it before SageMaker's kill.

SageMaker stops a job (``StopTrainingJob``, a spot reclaim) with SIGTERM and kills it
:data:`SIGTERM_GRACE_SECONDS` later (SageMaker API reference, StopTrainingJob); the trainer keeps
:data:`SAVE_EXIT_MARGIN_SECONDS` of that for its exit (``btk_trainer.stopping``, which reads both from here).
The stop's save is a ``torch.distributed.checkpoint`` of the model's fp32 weights and AdamW's two fp32 moments:
:data:`CHECKPOINT_BYTES_PER_PARAMETER` bytes a parameter, each written once across the job (a shard that data
parallel replicates is written by one of its ranks), spread over the nodes' local disks
(``/opt/ml/checkpoints``), plus kilobytes of trainer state and RNG. The trainer times every save and skips a
stop's save that its latest measured save says cannot finish in time (docs/trainer.md, "Checkpoints"). The plan
says what rate each node must sustain for the stop's save to fit; every written save's log line says the rate it
achieved (``btk: checkpoint step N written in S s: G GiB per node at R GiB/s``), and
:meth:`StopSave.largest_parameters` turns a rate into the largest model that fits (docs/planning.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIGTERM_GRACE_SECONDS = 120.0
SAVE_EXIT_MARGIN_SECONDS = 10.0
CHECKPOINT_BYTES_PER_PARAMETER = 12
"""fp32 weights (4) and AdamW's exp_avg and exp_avg_sq (4 + 4)."""
GIB = 1024**3


@dataclass(frozen=True)
class StopSave:
    """A stop's save for a model of ``parameters`` on ``nodes`` nodes."""

    parameters: int
    nodes: int

    @property
    def seconds(self) -> float:
        """What SageMaker's grace period leaves the save."""
        return SIGTERM_GRACE_SECONDS - SAVE_EXIT_MARGIN_SECONDS

    @property
    def gib_per_node(self) -> float:
        return self.parameters * CHECKPOINT_BYTES_PER_PARAMETER / self.nodes / GIB

    @property
    def needed_gib_per_second_per_node(self) -> float:
        return self.gib_per_node / self.seconds

    def largest_parameters(self, gib_per_second_per_node: float) -> int:
        """The most parameters whose stop save fits at that rate on these nodes.

        The closed form can land one parameter past the rate where the floating-point division back to GiB/s
        rounds up; it steps down until the rate it reports is the one it was given or less.
        """
        largest = int(gib_per_second_per_node * self.seconds * self.nodes * GIB // CHECKPOINT_BYTES_PER_PARAMETER)
        while largest > 0 and StopSave(largest, self.nodes).needed_gib_per_second_per_node > gib_per_second_per_node:
            largest -= 1
        return largest

    def describe(self) -> str:
        return (f"stop save: {self.gib_per_node:,.1f} GiB per node (fp32 weights and AdamW moments) in the "
                f"{self.seconds:.0f} s SageMaker leaves after SIGTERM: each node must write "
                f">= {self.needed_gib_per_second_per_node:.2f} GiB/s (the trainer skips a stop save its last "
                f"measured save says cannot finish)")

    def as_json(self) -> dict[str, Any]:
        return {"gib_per_node": round(self.gib_per_node, 2), "seconds": self.seconds,
                "needed_gib_per_second_per_node": round(self.needed_gib_per_second_per_node, 3)}
