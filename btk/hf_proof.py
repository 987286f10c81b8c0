"""An imported profile proven on transformers' own model of the same ``config.json``.

:mod:`btk.hf_import` reads the config; this module checks the result against the model transformers builds from
that config, so an import cannot quietly describe another network than the one the checkpoint holds:

1. **Full size, on the meta device** (no memory, no weights): transformers' ``AutoModelForCausalLM`` for the
   config and the trainer's ``Decoder`` for the imported architecture have the same parameters, name by name and
   shape by shape, and transformers' count is the profile's.
2. **A scaled-down copy with weights**: the same config at 2 layers, 16-wide heads, a 128-token vocabulary (the
   structure kept: grouped or multi-head attention, a head wider than hidden / heads, tied embeddings, biases,
   QK-norms, norm placement, RoPE scaling, Granite's multipliers, a block without RoPE, fused projections,
   Gemma's windowed and full blocks with a window narrower than the probe, its soft caps) is
   imported the same way; transformers' model gets random weights (norms and biases too), the trainer's model
   loads them, and their fp32 logits on the same tokens agree within
   :data:`LOGITS_TOLERANCE` (the same math in a different order).

A difference is one line naming the first parameter, the count or the logits' largest gap (:class:`BtkError`).
The trainer's model is ``containers/btk_trainer/model.py`` of this checkout (what the image ships).
"""

from __future__ import annotations

import copy
import importlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from btk.errors import BtkError, printable
from btk.hf_import import import_transformers, said
from btk.profile import ModelArchitecture

LOGITS_TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
"""fp32 logits of the scaled-down copy: transformers' and the trainer's may differ by this (op order, SDPA)."""

SCALED_LAYERS, SCALED_HEAD_DIM, SCALED_FFN, SCALED_VOCAB = 2, 16, 96, 128
PROBE_TOKENS = (2, 24)
"""(batch, sequence) of the tokens the logits are compared on."""

TRAINER_SOURCE = Path(__file__).resolve().parents[1] / "containers"


def _torch_and_transformers() -> tuple[Any, Any]:
    _trainer_on_path()
    try:
        import torch
    except ImportError:
        raise BtkError("btk profile import proves the import on transformers' model and needs torch, which is not "
                       "installed: make setup installs it") from None
    # transformers' model classes import torchao where it is installed: its lines about CUDA kernels a CPU-only
    # check never uses are the trainer's to drop, by the trainer's rule.
    importlib.import_module("btk_trainer.third_party_logs").quiet_third_party_logs(torch.cuda.is_available())
    return torch, import_transformers()


def _trainer_model() -> ModuleType:
    """``btk_trainer.model`` from this checkout's ``containers/`` (it is not an installed package)."""
    _trainer_on_path()
    return importlib.import_module("btk_trainer.model")


def _trainer_on_path() -> None:
    try:
        importlib.import_module("btk_trainer")
        return
    except ImportError:
        pass
    if not (TRAINER_SOURCE / "btk_trainer").is_dir():
        raise BtkError(f"the trainer's model is not at {printable(str(TRAINER_SOURCE))}/btk_trainer: run btk from "
                       "the project's checkout")
    sys.path.append(str(TRAINER_SOURCE))


@contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


EAGER_ATTENTION = ("gemma2",)
"""Model types transformers builds with its eager attention only (Gemma 2: SDPA takes no soft cap)."""


def _hf_model(transformers: Any, config: Mapping[str, Any]) -> Any:
    """transformers' causal LM for ``config`` (fp32, SDPA attention where the model type has it), built where the
    caller's device says."""
    attention = "eager" if config.get("model_type") in EAGER_ATTENTION else "sdpa"
    try:
        with _quiet():
            hf_config = transformers.AutoConfig.for_model(**copy.deepcopy(dict(config)))
            hf_config.torch_dtype = None
            return transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=attention)
    except Exception as error:  # transformers' own refusal of the config: whatever it raises, said in one line
        raise BtkError(printable(f"config.json: transformers cannot build the model it describes: {said(error)}")
                       ) from None


def _shapes(model: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}


def _first_difference(theirs: dict[str, tuple[int, ...]], ours: dict[str, tuple[int, ...]], model_class: str) -> str:
    for name in sorted(set(theirs) | set(ours)):
        if name not in ours:
            return f"transformers' {model_class} has {name} {theirs[name]}, the trainer's model does not"
        if name not in theirs:
            return f"the trainer's model has {name} {ours[name]}, transformers' {model_class} does not"
        if theirs[name] != ours[name]:
            return f"{name} is {theirs[name]} in transformers' {model_class}, {ours[name]} in the trainer's model"
    return ""


def check_full_size(config: Mapping[str, Any], arch: ModelArchitecture) -> tuple[str, int]:
    """Parameters and count of transformers' model of ``config`` against the trainer's of ``arch`` (meta device);
    transformers' model class and count."""
    torch, transformers = _torch_and_transformers()  # first: says in one line which of them is missing
    decoder = _trainer_model().Decoder
    with torch.device("meta"):
        theirs = _hf_model(transformers, config)
        ours = decoder(arch)
    model_class = type(theirs).__name__
    their_parameters = _trainer_model().from_hf_state_dict(dict(theirs.named_parameters()), arch)
    difference = _first_difference({name: tuple(tensor.shape) for name, tensor in their_parameters.items()},
                                   _shapes(ours), model_class)
    if difference:
        raise BtkError(printable(f"config.json: the import does not build transformers' model: {difference}"))
    count = sum(parameter.numel() for parameter in theirs.parameters())
    if count != arch.parameter_count:
        raise BtkError(f"config.json: transformers' {model_class} has {count:,} parameters, the imported "
                       f"architecture {arch.parameter_count:,}")
    return model_class, int(count)


def scaled_config(config: Mapping[str, Any], arch: ModelArchitecture) -> dict[str, Any]:
    """``config`` at :data:`SCALED_LAYERS` layers and small widths, with its structure kept."""
    group = arch.num_attention_heads // arch.num_kv_heads
    kv_heads = min(arch.num_kv_heads, 2)
    heads = kv_heads * min(group, 2)
    wide_head = arch.effective_head_dim * arch.num_attention_heads != arch.hidden_size
    hidden = heads * SCALED_HEAD_DIM // (2 if wide_head else 1)
    scaled = {
        **copy.deepcopy(dict(config)),
        "num_hidden_layers": SCALED_LAYERS,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": SCALED_FFN,
        "vocab_size": SCALED_VOCAB,
    }
    if "head_dim" in config or wide_head:
        scaled["head_dim"] = SCALED_HEAD_DIM
    for token in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids past the small vocabulary, or the
        value = scaled.get(token)  # config class's default id when the file leaves it out (SmolLM3's pad 128004)
        if not isinstance(value, int) or value >= SCALED_VOCAB:
            scaled[token] = None
    scaled.pop("layer_types", None)  # one entry per layer of the full model
    windows = {arch.window(index) for index in range(arch.num_layers)}
    if arch.sliding_window is not None:  # Gemma: a window the probe outgrows; a windowed and a full block if it has
        scaled["sliding_window"] = min(arch.sliding_window, PROBE_TOKENS[1] // 3)
        scaled["layer_types"] = ["sliding_attention", "full_attention" if None in windows else "sliding_attention"]
    elif arch.is_gemma:
        scaled["layer_types"] = ["full_attention"] * SCALED_LAYERS
    scaled.pop("no_rope_layers", None)
    if arch.no_rope_interval is not None:  # SmolLM3: the second of the two blocks without RoPE
        scaled["no_rope_layer_interval"] = min(arch.no_rope_interval, SCALED_LAYERS)
    return scaled


def check_scaled_logits(config: Mapping[str, Any], scaled_arch: ModelArchitecture) -> float:
    """The scaled copy's logits, transformers' against the trainer's on the same random weights; the largest gap."""
    torch, transformers = _torch_and_transformers()
    generator = torch.Generator().manual_seed(0)
    theirs = _hf_model(transformers, config).float().eval()
    with torch.no_grad():
        for parameter in theirs.parameters():  # every parameter random: a misplaced norm or bias shows
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1
                            + (1.0 if parameter.ndim == 1 else 0.0))
    ours = _trainer_model().Decoder(scaled_arch).float().eval()
    state = _trainer_model().from_hf_state_dict(theirs.state_dict(), scaled_arch)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise BtkError(printable(f"config.json: the scaled copy's weights do not load into the trainer's model: "
                                 f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"))
    tokens = torch.randint(0, SCALED_VOCAB, PROBE_TOKENS, generator=generator)
    try:
        with torch.no_grad(), _quiet():
            expected = theirs(input_ids=tokens).logits
            actual = ours.logits(tokens)
    except Exception as error:  # either model refusing the config's shapes at run time: said in one line
        raise BtkError(printable(f"config.json: a 2-layer copy of the model does not run: {said(error)}")) from None
    gap = float((actual - expected).abs().max())
    if not torch.allclose(actual, expected, **LOGITS_TOLERANCE):
        raise BtkError(f"config.json: on a 2-layer copy with the same weights, the trainer's logits differ from "
                       f"transformers' {type(theirs).__name__} by up to {gap:.3g} (tolerance: atol "
                       f"{LOGITS_TOLERANCE['atol']:g}, rtol {LOGITS_TOLERANCE['rtol']:g})")
    return gap


@dataclass(frozen=True)
class ImportProof:
    """What :func:`prove_import` established."""

    model_class: str
    parameter_count: int
    max_logit_gap: float

    def as_json(self) -> dict[str, Any]:
        from btk.hf_import import TRANSFORMERS_PIN

        return {"transformers": TRANSFORMERS_PIN, "model_class": self.model_class,
                "parameter_count": self.parameter_count, "scaled_layers": SCALED_LAYERS,
                "max_logit_gap": self.max_logit_gap, "logits_tolerance": LOGITS_TOLERANCE}

    def summary(self) -> str:
        from btk.hf_import import TRANSFORMERS_PIN

        return (f"proven on transformers {TRANSFORMERS_PIN}'s {self.model_class}: the same "
                f"{self.parameter_count:,} parameters, shape by shape; a {SCALED_LAYERS}-layer copy's fp32 logits "
                f"within {LOGITS_TOLERANCE['atol']:g} (largest gap {self.max_logit_gap:.2g})")


def prove_import(config: Mapping[str, Any], arch: ModelArchitecture) -> ImportProof:
    """Both checks on an imported ``config`` (already read into ``arch``; dropout, which acts in training only, is
    no reason to refuse the copy compared in eval mode)."""
    from btk.hf_import import architecture_from_config

    model_class, count = check_full_size(config, arch)
    small = scaled_config(config, arch)
    return ImportProof(model_class, count,
                       check_scaled_logits(small, architecture_from_config(small, without_dropout=True)))
