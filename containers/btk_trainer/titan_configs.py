"""torchtitan's side of the GPU benchmark: a config for ``torchtitan.train`` and its check without a GPU.

This module runs in torchtitan's own environment (``containers/bench/torchtitan.lock``: torchtitan 0.3.0 on
the image's torch stack) and imports nothing of the kit, so it needs only what that lock installs.

* :func:`btk_case` is a torchtitan config function (``--module btk_trainer.titan_configs --config btk_case``):
  torchtitan's own Llama 3 recipe (``llama3_8b``: its AdamW, chunked loss, defaults) with the model of the
  flavor and the float8 converter that :data:`CASE_ENV` names; the knobs (sequence length, micro-batch,
  compile, activation checkpointing, steps) come as torchtitan's own command-line flags. Profiling,
  TensorBoard, checkpoints and validation are off: a throughput run.
* ``python -m btk_trainer.titan_configs ARGV...`` parses ``ARGV`` (torchtitan.train's arguments) with
  torchtitan's own config manager, builds the model on the meta device, and the tokenizer and the data
  loader, takes one batch, and prints one JSON line: the flavor, the parameter count and the batch's shape.
  Everything ``torchtitan.train`` does before its first CUDA call (``torch.cuda.set_device``), so a case
  that would fail there fails here, on any machine.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

#: The case torchtitan runs: JSON ``{"flavor": ..., "precision": "bf16" | "fp8_rowwise"}``.
CASE_ENV = "BTK_TORCHTITAN_CASE"


def _case() -> dict[str, Any]:
    raw = os.environ.get(CASE_ENV)
    if raw is None:
        raise SystemExit(f"btk_trainer.titan_configs: {CASE_ENV} is not set")
    case: dict[str, Any] = json.loads(raw)
    return case


def btk_case() -> Any:
    """torchtitan's Llama 3 recipe with :data:`CASE_ENV`'s flavor and precision (float8 rowwise through
    torchtitan's converter, the head left in bf16 as the kit's trainer leaves it)."""
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_8b

    case = _case()
    converters = None
    if case["precision"] == "fp8_rowwise":
        from torchtitan.components.quantization import Float8LinearConverter

        converters = [Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"],
                                                   model_compile_enabled=bool(case.get("compile", True)))]
    elif case["precision"] != "bf16":
        raise SystemExit(f"btk_trainer.titan_configs: torchtitan 0.3.0 has no {case['precision']} recipe")
    config = llama3_8b()
    config.model_spec = model_registry(case["flavor"], converters=converters)
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    config.profiler.enable_profiling = False
    config.metrics.enable_tensorboard = False
    config.checkpoint.enable = False
    config.validator.enable = False
    return config


def check(argv: Sequence[str]) -> dict[str, Any]:
    """What ``torchtitan.train`` builds before its first CUDA call, built here on the CPU (see the module)."""
    import torch
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args(list(argv))
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer,
                                     seq_len=config.training.seq_len,
                                     local_batch_size=config.training.local_batch_size, snapshot_every_n_steps=None)
    inputs, labels = next(iter(loader))
    tokens = inputs["input"] if isinstance(inputs, dict) else inputs
    return {"flavor": config.model_spec.flavor, "parameters": sum(p.numel() for p in model.parameters()),
            "batch": list(tokens.shape), "labels": list(labels.shape)}


if __name__ == "__main__":
    print(json.dumps(check(sys.argv[1:])))
