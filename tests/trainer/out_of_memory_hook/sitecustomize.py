"""Test-only: imported by every Python process started with this directory on PYTHONPATH.

With ``BTK_TEST_OUT_OF_MEMORY_RANK`` set, that rank runs out of memory (``torch.OutOfMemoryError``)
in the first micro-batch larger than ``BTK_TEST_OUT_OF_MEMORY_ABOVE`` sequences, as a GPU would
when the plan's knobs need more memory than it has (tests/trainer/test_end_to_end.py). The data
loader is patched, not the trainer: ``python -m btk_trainer.train`` runs the trainer module anew
as ``__main__``.
"""

import os

if os.environ.get("BTK_TEST_OUT_OF_MEMORY_RANK") == os.environ.get("RANK", "-"):
    import torch
    from btk_trainer import data

    limit = int(os.environ["BTK_TEST_OUT_OF_MEMORY_ABOVE"])
    read = data.BatchLoader.next

    def out_of_memory_above(self: data.BatchLoader) -> data.Batch:
        batch = read(self)
        if batch.inputs.shape[0] > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        return batch

    data.BatchLoader.next = out_of_memory_above
