"""torchtitan beside the trainer: the GPU benchmark's cases trained by torchtitan 0.3.0, and the ratio.

    python -m btk_trainer.titan_baseline --results out/results.json --markdown out/performance.md \\
        --python .venv-gpu-bench-titan/bin/python [--until-cuda]

Reads the benchmark's ``results.json`` (:mod:`btk_trainer.bench`) and, for each measured case torchtitan can
train the same way, runs ``torchtitan.train`` (its published wheel, in its own environment:
``containers/bench/torchtitan.lock``) on one GPU with the case's knobs, and writes ``torchtitan`` into the case:
tokens/s per GPU and peak reserved memory over the timed steps, and ``ratio``, the trainer's tokens/s over
torchtitan's. A Markdown table is appended to ``--markdown``.

Same model: the case's profile must be one of torchtitan's Llama 3 flavors (:data:`FLAVORS`: the same widths
and no layout of another family), and before anything runs torchtitan's own model, built on the meta device
by ``btk_trainer.titan_configs``, must have the profile's parameter count. Same knobs: sequence length,
micro-batch, activation checkpointing and compile from the case; bf16 compute; float8 only as ``fp8_rowwise``
(torchtitan 0.3.0 has no tensorwise recipe); one GPU, no tensor or context parallelism, no accumulation.
What stays torchtitan's: its AdamW, chunked loss, CUDA graphs (on by default), and attention restricted to
documents (flex attention; its data loader always passes document positions). The synthetic documents are
longer than a sequence, so that mask is plain causal attention, as the trainer's synthetic tokens are.

Tokens per second: torchtitan logs each step's ``tps`` (tokens per second per device since the previous log,
``--metrics.log_freq 1``); the first ``--warmup`` steps (compile, CUDA graph capture) are left out and the
rest averaged by time (tokens over seconds). ``memory`` is its peak reserved GiB.

Without a GPU (``--until-cuda``) each comparable case is checked up to torchtitan's first CUDA call
(``btk_trainer.titan_configs``: its config parsed, its model and data loader built) and recorded as ready.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from btk.errors import BtkError
from btk.files import write_atomically
from btk.profile import ModelArchitecture
from btk_trainer.titan_configs import CASE_ENV

#: torchtitan 0.3.0's Llama 3 flavors (``torchtitan/models/llama3/__init__.py`` in its wheel): the widths the
#: trainer's architecture must have for torchtitan to train the same model.
FLAVORS: dict[str, dict[str, Any]] = {
    "1B": {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_kv_heads": 8,
           "ffn_hidden_size": 8192, "vocab_size": 128256, "tied_embeddings": True},
    "3B": {"num_layers": 28, "hidden_size": 3072, "num_attention_heads": 24, "num_kv_heads": 8,
           "ffn_hidden_size": 8192, "vocab_size": 128256, "tied_embeddings": True},
    "8B": {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
           "ffn_hidden_size": 14336, "vocab_size": 128256, "tied_embeddings": False},
    "70B": {"num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_kv_heads": 8,
            "ffn_hidden_size": 28672, "vocab_size": 128256, "tied_embeddings": False},
}
#: Fields a flavor leaves to the profile (RoPE's base and scaling, the longest context): they do not change
#: the model's shape or its work per token at the benchmark's sequence lengths.
LEFT_TO_THE_PROFILE = {"rope_theta", "rope_scaling", "max_context", "rms_norm_eps"}
TORCHTITAN_PRECISIONS = ("bf16", "fp8_rowwise")
#: torchtitan's per-step line (``torchtitan/components/metrics.py``), colours off.
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*\S+\s+grad_norm:\s*\S+\s+memory:\s*([\d.]+)GiB\([\d.]+%\)\s+"
                       r"tps:\s*([\d,]+)")
TOKENIZER_VOCABULARY = 2048
"""The synthetic tokenizer's size: any ids below the model's vocabulary train the same (the embedding lookup and
the head's work do not depend on which ids)."""


@dataclass(frozen=True)
class TitanStep:
    step: int
    peak_reserved_gib: float
    tokens_per_second: float


def flavor_for(arch: ModelArchitecture) -> str | None:
    """torchtitan's Llama 3 flavor of ``arch``, or None when it has none (other widths, another family's layout)."""
    for name, widths in FLAVORS.items():
        plain = ModelArchitecture(**widths, max_context=arch.max_context)
        if arch.model_dump(exclude=LEFT_TO_THE_PROFILE) == plain.model_dump(exclude=LEFT_TO_THE_PROFILE):
            return name
    return None


def not_comparable(case: dict[str, Any], arch: ModelArchitecture, *, planned: bool = False) -> str | None:
    """Why torchtitan cannot train ``case`` (an entry of the benchmark's results) the same way, or None;
    ``planned``: a case the benchmark only planned (``--plan-only``) counts as the trainer's."""
    knobs = case["knobs"]
    if case.get("status") != "measured" and not (planned and case.get("status") == "pending"):
        return "the trainer did not measure it"
    if flavor_for(arch) is None:
        return "torchtitan 0.3.0 has no Llama 3 flavor of this architecture"
    if knobs["precision"] not in TORCHTITAN_PRECISIONS:
        return f"torchtitan 0.3.0 has no {knobs['precision']} recipe"
    if knobs["tensor_parallel"] > 1 or knobs.get("context_parallel", 1) > 1:
        return "tensor or context parallelism on one GPU"
    if knobs["gradient_accumulation_steps"] > 1:
        return "gradient accumulation"
    return None


def write_assets(directory: Path, seq_len: int, sequences: int, seed: int = 0) -> tuple[Path, Path]:
    """A byte-level BPE tokenizer of :data:`TOKENIZER_VOCABULARY` tokens and a JSON-lines dataset of documents
    longer than ``seq_len`` tokens, enough for ``sequences`` sequences: torchtitan's ``--hf_assets_path`` and
    ``--dataloader.dataset_path``, made here (nothing is downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    # A word is at most a few tokens and at least one: documents of 1.25 x seq_len words are longer than a sequence.
    documents = [" ".join(rng.choice(words) for _ in range(seq_len * 5 // 4)) for _ in range(sequences + 1)]
    begin, end = "<|begin_of_text|>", "<|end_of_text|>"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCABULARY, special_tokens=[begin, end],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(documents[:8], trainer)
    tokenizer_dir, data_dir = directory / "tokenizer", directory / "data"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": begin, "eos_token": end, "add_bos_token": False, "add_eos_token": False}))
    (data_dir / "data.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    return tokenizer_dir, data_dir


def titan_argv(knobs: dict[str, Any], assets: tuple[Path, Path], steps: int, dump_folder: Path) -> list[str]:
    """``torchtitan.train``'s arguments for a case's knobs (:mod:`btk_trainer.titan_configs` sets the model)."""
    tokenizer_dir, data_dir = assets
    return ["--module", "btk_trainer.titan_configs", "--config", "btk_case",
            "--hf_assets_path", str(tokenizer_dir), "--dataloader.dataset", "c4_test",
            "--dataloader.dataset_path", str(data_dir),
            "--training.seq_len", str(knobs["seq_len"]), "--training.local_batch_size", str(knobs["micro_batch_size"]),
            "--training.steps", str(steps), "--training.mixed_precision_param", "bfloat16",
            "--compile.enable" if knobs["compile"] else "--compile.no-enable",
            "--metrics.log_freq", "1", "--metrics.disable_color_printing", "--dump_folder", str(dump_folder),
            # torchtitan's checkpointing choice is a subcommand, and the last argument.
            f"activation-checkpoint:{knobs['activation_checkpointing']}"]


def parse_steps(log: str) -> list[TitanStep]:
    """Every step line torchtitan printed, in order."""
    return [TitanStep(int(match[1]), float(match[2]), float(match[3].replace(",", "")))
            for match in STEP_LINE.finditer(re.sub(r"\x1b\[[0-9;]*m", "", log))]


def timed_figures(steps: list[TitanStep], warmup: int, tokens_per_step: int) -> tuple[float, float]:
    """Tokens/s per GPU over the steps after ``warmup`` (tokens over seconds) and their peak reserved GiB."""
    timed = [step for step in steps if step.step > warmup]
    if not timed:
        raise BtkError(f"torchtitan logged {len(steps)} steps, none after the {warmup} warm-up steps")
    seconds = sum(tokens_per_step / step.tokens_per_second for step in timed)
    return tokens_per_step * len(timed) / seconds, max(step.peak_reserved_gib for step in timed)


def run_environment(case: dict[str, Any], flavor: str, workdir: Path) -> dict[str, str]:
    """This process's environment (the pipeline's variables included) plus the case and the import path.

    Hugging Face ``datasets`` converts the generated JSON-lines file to Arrow when torchtitan loads it, into its
    cache: that cache is ``workdir``'s, not the user's (``~/.cache/huggingface/datasets``), where every run's new
    dataset would add an entry that nothing reads again."""
    containers = str(Path(__file__).resolve().parents[1])
    return {**os.environ, CASE_ENV: json.dumps({"flavor": flavor, "precision": case["knobs"]["precision"],
                                                              "compile": case["knobs"]["compile"]}),
            "PYTHONPATH": os.pathsep.join(filter(None, [containers, os.environ.get("PYTHONPATH")])),
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(workdir / "hf-datasets-cache")}


def check_case(python: str, argv: list[str], environment: dict[str, str], expected_parameters: int) -> dict[str, Any]:
    """torchtitan's build of the case up to its first CUDA call; its model must have the profile's parameters."""
    result = subprocess.run([python, "-m", "btk_trainer.titan_configs", *argv], env=environment, capture_output=True,
                            text=True, timeout=600, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BtkError(f"torchtitan could not build the case: {last}")
    built: dict[str, Any] = json.loads(lines[-1])
    if built["parameters"] != expected_parameters:
        raise BtkError(f"torchtitan's {built['flavor']} has {built['parameters']:,} parameters, the profile "
                       f"{expected_parameters:,}: not the same model")
    return built


def run_case(python: str, argv: list[str], environment: dict[str, str], timeout: float) -> str:
    """``torchrun`` of torchtitan.train on one GPU; its output."""
    command = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               "-m", "torchtitan.train", *argv]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BtkError(f"torchtitan.train exited {result.returncode}: {last}")
    return result.stdout + result.stderr


def markdown(cases: list[dict[str, Any]]) -> str:
    rows = ["", "### torchtitan 0.3.0 on the same cases", "",
            "| profile | case | torchtitan tokens/s/GPU | trainer tokens/s/GPU | trainer / torchtitan | "
            "torchtitan peak GiB (reserved) | trainer peak GiB (reserved) | note |",
            "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        titan = case.get("torchtitan")
        if titan is None:
            continue
        measured = case.get("measured") or {}
        if "tokens_per_second_per_gpu" in titan:
            rows.append(f"| {case['profile']} | {case['label']} | {titan['tokens_per_second_per_gpu']:,.0f} | "
                        f"{measured.get('tokens_per_second_per_gpu', 0):,.0f} | {titan['ratio']:.2f} | "
                        f"{titan['peak_reserved_gib']:.1f} | {measured.get('peak_reserved_gib', 0):.1f} | |")
        else:
            rows.append(f"| {case['profile']} | {case['label']} | | | | | | {titan['status']} |")
    return "\n".join(rows) + "\n"


def compare(results: dict[str, Any], architectures: dict[str, ModelArchitecture], python: str, workdir: Path, *,
            steps: int, warmup: int, until_cuda: bool, deadline: float | None) -> list[str]:
    """Writes ``torchtitan`` into each case of ``results``; returns the lines to print."""
    lines = []
    assets: dict[tuple[int, int], tuple[Path, Path]] = {}
    for case in results["cases"]:
        arch = architectures[case["profile"]]
        why = not_comparable(case, arch, planned=until_cuda)
        if why is not None:
            case["torchtitan"] = {"status": f"not run: {why}"}
            lines.append(f"btk-titan: case {case['number']} ({case['profile']}, {case['label']}): not run: {why}")
            continue
        flavor = flavor_for(arch)
        assert flavor is not None
        knobs = case["knobs"]
        key = (knobs["seq_len"], knobs["micro_batch_size"])
        if key not in assets:
            assets[key] = write_assets(workdir / f"assets-{key[0]}x{key[1]}", knobs["seq_len"],
                                       knobs["micro_batch_size"] * (steps + 1))
        argv = titan_argv(knobs, assets[key], steps, workdir / f"case-{case['number']}")
        environment = run_environment(case, flavor, workdir)
        try:
            if knobs["precision"] == "bf16" or not until_cuda:  # torchtitan's float8 converter asks for a GPU
                built = check_case(python, argv, environment, arch.parameter_count)
                lines.append(f"btk-titan: case {case['number']}: torchtitan's {flavor} built up to its first CUDA "
                             f"call, {built['parameters']:,} parameters as the profile's, batch {built['batch']}")
            if until_cuda:
                case["torchtitan"] = {"status": "ready: stopped before the first CUDA call", "flavor": flavor}
                continue
            left = None if deadline is None else deadline - time.time()
            if left is not None and left < 60:
                case["torchtitan"] = {"status": "not run: the budget is spent"}
                lines.append(f"btk-titan: case {case['number']}: not run: the budget is spent")
                continue
            started = time.time()
            log = run_case(python, argv, environment, timeout=left if left is not None else 1800)
            tokens, peak = timed_figures(parse_steps(log), warmup, knobs["seq_len"] * knobs["micro_batch_size"])
        except (BtkError, subprocess.TimeoutExpired) as error:
            case["torchtitan"] = {"status": f"failed: {error}"}
            lines.append(f"btk-titan: case {case['number']}: failed: {error}")
            continue
        ours = case["measured"]["tokens_per_second_per_gpu"]
        case["torchtitan"] = {"status": "measured", "flavor": flavor, "tokens_per_second_per_gpu": tokens,
                              "peak_reserved_gib": peak, "ratio": ours / tokens, "steps": steps, "warmup": warmup,
                              "wall_seconds": round(time.time() - started, 1)}
        lines.append(f"btk-titan: case {case['number']}: torchtitan {tokens:,.0f} tokens/s/GPU, the trainer "
                     f"{ours:,.0f} ({ours / tokens:.2f}x), peak reserved {peak:.1f} GiB")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="btk_trainer.titan_baseline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True, help="the benchmark's results.json (rewritten)")
    parser.add_argument("--markdown", type=Path, default=None, help="append the comparison table here")
    parser.add_argument("--python", default=sys.executable, help="the Python of torchtitan's environment")
    parser.add_argument("--workdir", type=Path, default=None, help="assets and torchtitan's output (default: beside "
                        "the results)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out: compile and CUDA graph capture")
    parser.add_argument("--deadline", type=float, default=None, help="a Unix time no torchtitan run may pass")
    parser.add_argument("--until-cuda", action="store_true", help="check each case up to the first CUDA call")
    args = parser.parse_args(argv)
    try:
        if not 1 <= args.warmup < args.steps:
            raise BtkError(f"--warmup {args.warmup} --steps {args.steps}: warm-up from 1 to fewer than the steps")
        results = json.loads(args.results.read_text())
        from btk import catalog

        profiles = catalog.all_profiles()
        architectures = {case["profile"]: profiles[case["profile"]].architecture for case in results["cases"]}
        workdir = args.workdir or args.results.parent / "torchtitan"
        lines = compare(results, architectures, args.python, workdir, steps=args.steps, warmup=args.warmup,
                        until_cuda=args.until_cuda, deadline=args.deadline)
    except (BtkError, OSError, ValueError, KeyError) as error:
        print(f"btk-titan: {error}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    write_atomically(args.results, json.dumps(results, indent=2) + "\n")
    if args.markdown is not None:
        with args.markdown.open("a") as handle:
            handle.write(markdown(results["cases"]))
    return 1 if any(case["torchtitan"]["status"].startswith("failed") for case in results["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
