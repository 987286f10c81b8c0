"""The environment variables every training process runs with, in one place for the pipeline and the GPU benchmark.

The pipeline sets them on each SageMaker training job (``training_constructs.pipeline_definition.job_environment``,
with the instance type's network settings from the hardware catalog on top); ``scripts/gpu_bench.sh`` exports
them before the benchmark's first Python process (``python -m btk.training_environment`` prints ``export``
lines), so the benchmark's allocator and NCCL behave as a job's and its peak memory compares with the planner's.
"""

from __future__ import annotations

import shlex

TRAINING_PROCESS_ENVIRONMENT: dict[str, str] = {
    # NCCL bootstrap/out-of-band traffic: any interface except loopback and docker bridges.
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    # Warnings and errors only: INFO floods CloudWatch Logs at 8 GPUs per node.
    "NCCL_DEBUG": "WARN",
    # A failed or hung collective aborts the process group instead of hanging the job.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # FSDP2 frees all-gather buffers without recordStream (lower peak memory; torchtitan default).
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    # Fewer fragmentation OOMs with varying activation shapes.
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def export_lines(variables: dict[str, str]) -> str:
    """``variables`` as POSIX shell ``export`` lines, quoted."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


if __name__ == "__main__":
    print(export_lines(TRAINING_PROCESS_ENVIRONMENT), end="")
