"""Quiet the third-party log lines a trainer user cannot act on, at their source loggers.

Importing torchao (the float8 and MXFP8 paths) logs two kinds of lines that say nothing a user
of the trainer can change, and torch's DTensor a third under tensor parallelism:

* ``torchao``: ``Failed to load .../torchao/_C_mxfp8...so`` and ``..._C_cutlass_90a...so``.
  These are torchao's CUDA kernel extensions; the MXFP8 one is built for one Python version
  only. On a machine without CUDA (the dry run, the tests, ``btk`` on a laptop) no CUDA kernel
  can load and none is used, so the line is dropped there. With CUDA it is kept: there it says
  which of torchao's kernels the run goes without.
* ``torch.utils._pytree``: ``<enum 'KernelPreference'> is an Enum subclass ... Calling
  register_constant() on Enum subclasses is deprecated``. torchao's own modules make that call
  at import; nothing in our code does, so the line is dropped everywhere.
* ``torch.distributed.tensor._redistribute``: ``While redistributing from (_NormPartial(2.0),
  _NormPartial(2.0)) to (Replicate(), Replicate()), 2 sequential all_reduce operations will be
  performed ... flatten mesh dimensions ["dp_shard", "tp"]``, once per process with
  ``tensor_parallel > 1``. It is gradient clipping's global norm
  (:func:`btk_trainer.train.clip_grad_norm`): one fp32 scalar, reduced over the data-parallel
  and the tensor-parallel dimension in turn, every rank in the same order. The single reduction
  the line offers needs a flattened mesh, that is one more process group (with NCCL, one more
  communicator and its buffers on every GPU) to save one 4-byte all-reduce per step. Only
  reductions of norms (``_NormPartial``) are dropped: the line for any other tensor passes.

Only those messages are dropped: every other line of those loggers passes through.
"""

from __future__ import annotations

import logging

_CUDA_EXTENSION_NEEDLES = ("Failed to load ", "/torchao/_C")
_PYTREE_ENUM_NEEDLES = ("is an Enum subclass", "register_constant() on Enum subclasses is deprecated")
_NORM_REDUCTION_NEEDLES = ("While redistributing from (", "_NormPartial(", "sequential all_reduce operations")


class DropMessages(logging.Filter):
    """Drops the records whose message contains every needle of any one of ``patterns``."""

    def __init__(self, *patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(all(needle in message for needle in pattern) for pattern in self.patterns)


def _install(logger_name: str, log_filter: DropMessages) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(existing, DropMessages) for existing in logger.filters):
        logger.addFilter(log_filter)


def quiet_third_party_logs(cuda_available: bool) -> None:
    """Install the filters (idempotent); call before the first ``import torchao``."""
    _install("torch.utils._pytree", DropMessages(_PYTREE_ENUM_NEEDLES))
    _install("torch.distributed.tensor._redistribute", DropMessages(_NORM_REDUCTION_NEEDLES))
    if not cuda_available:
        _install("torchao", DropMessages(_CUDA_EXTENSION_NEEDLES))
