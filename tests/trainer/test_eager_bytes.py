"""benchmarks/eager_bytes.py: the trainer's eager block counted op by op, beside the planner's compiled count.

The count on fake tensors is the count on real ones (the fake mode changes no op a block runs), and
docs/calibration.md's table of what compile fuses, the range it states over the calibration set's models and
the bytes of each part of the block are what the script prints.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType

import pytest
from script_module import ROOT, load_script
from trainer_fixtures import tiny_llama, tiny_olmo2, tiny_qwen3

from btk.profile import ModelArchitecture

DOC = ROOT / "docs" / "calibration.md"


def eager_bytes() -> ModuleType:
    return load_script("benchmarks/eager_bytes.py")


@pytest.mark.parametrize("layout", [tiny_llama, tiny_qwen3, tiny_olmo2], ids=["llama", "qwen3", "olmo2"])
def test_fake_tensors_count_the_bytes_real_tensors_move(layout: Callable[..., ModelArchitecture]) -> None:
    module = eager_bytes()
    arch = layout(hidden_size=128, ffn_hidden_size=320)
    fake, real = (module.eager_bytes_per_token_and_layer(arch, fake=fake) for fake in (True, False))
    assert fake == real > module.compiled_bytes_per_token_and_layer(arch)


def test_the_documented_counts_are_what_the_script_prints() -> None:
    module = eager_bytes()
    models = module.calibration_models()
    counted = {name: (module.eager_bytes_per_token_and_layer(arch), module.compiled_bytes_per_token_and_layer(arch))
               for name, arch in models.items()}
    text = DOC.read_text()
    rows = re.findall(r"^\| ([\w.,\- ]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+)x \|$", text,
                      re.MULTILINE)
    assert len(rows) >= 3
    for names, hidden, ffn, eager, compiled, ratio in rows:
        for name in names.split(", "):
            arch, (want_eager, want_compiled) = models[name], counted[name]
            assert (int(hidden.replace(",", "")), int(ffn.replace(",", ""))) == (arch.hidden_size,
                                                                                 arch.ffn_hidden_size)
            assert (eager, compiled) == (f"{want_eager:,.0f}", f"{want_compiled:,.0f}")
            assert ratio == f"{want_eager / want_compiled:.2f}"
    ratios = [eager / compiled for eager, compiled in counted.values()]
    assert f"Over all {len(ratios)} models the ratio is {min(ratios):.2f}x to {max(ratios):.2f}x." in text
    parts = module.component_bytes_per_element()
    documented = re.search(r"a norm moves (\d+) bytes per\s+element.*?RoPE (\d+) per\s+element.*?SwiGLU (\d+) per",
                           text, re.DOTALL)
    assert documented is not None
    assert documented.groups() == tuple(f"{parts[name]:.0f}" for name in ("norm", "rope", "swiglu"))
