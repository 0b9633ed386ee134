"""1B-class benchmark models without a hub: Llama-3.2-1B- and Qwen2.5-1.5B-shaped checkpoints with random weights.

    python scripts/make_bench_models.py [--out ~/.cache/tgictl/bench-models] [--models llama-3.2-1b,qwen2.5-1.5b]
        [--gguf-types Q4_0] [--llama-cpp ~/.cache/llamacpp]

For each model, into OUT/NAME/: `hf/` (the real model's config.json field for field, random bf16 weights written
by transformers, a tokenizer of the real vocabulary layout synthesized with `tokenizers`:
tgictl/testing/synthetic_tokenizer.py), then the GGUFs made by llama.cpp's own tools: its converter
(convert_hf_to_gguf.py in the llama-cpp-python sdist, bf16) and llama-quantize for each --gguf-types (the bf16
file is deleted afterwards). What exists is kept: a second run only makes what is missing.

The converter names a BPE pre-tokenizer by hashing a real tokenizer's ids for a fixed text; a synthesized vocabulary
has no known hash, so the converter runs with that one lookup answered by the pre-tokenizer whose split regex the
tokenizer uses (`llama-bpe`, `qwen2`): everything else is the converter as shipped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing tgictl

from tgictl.testing.synthetic_tokenizer import LLAMA3, QWEN2, TokenizerLayout, write_tokenizer  # noqa: E402

LLAMA_CPP_PYTHON_VERSION = "0.3.36"

# config.json of meta-llama/Llama-3.2-1B-Instruct, field for field.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
# config.json of Qwen/Qwen2.5-1.5B-Instruct, field for field.
QWEN2_5_1_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02, "intermediate_size": 8960,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 12,
    "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
MODELS: dict[str, tuple[dict, TokenizerLayout]] = {
    "llama-3.2-1b": (LLAMA_3_2_1B, LLAMA3),
    "qwen2.5-1.5b": (QWEN2_5_1_5B, QWEN2),
}
DEFAULT_OUT = Path.home() / ".cache" / "tgictl" / "bench-models"
DEFAULT_LLAMA_CPP = Path.home() / ".cache" / "llamacpp"


def hf_dir(out: Path, name: str) -> Path:
    return out / name / "hf"


def gguf_path(out: Path, name: str, gguf_type: str) -> Path:
    return out / name / f"{name}-{gguf_type}.gguf"


def write_checkpoint(path: Path, config_fields: dict, layout: TokenizerLayout, seed: int = 0) -> None:
    """config.json, generation_config.json, random bf16 safetensors and the synthesized tokenizer into `path`."""
    import torch
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    write_tokenizer(path, layout, seed=seed, model_max_length=config_fields["max_position_embeddings"])
    config = transformers.AutoConfig.for_model(**{k: v for k, v in config_fields.items() if k != "architectures"})
    config.architectures = config_fields["architectures"]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config_fields["bos_token_id"], eos_token_id=config_fields["eos_token_id"], do_sample=False)
    model.save_pretrained(path, safe_serialization=True)
    # save_pretrained writes transformers' own spelling of the config; the real file's fields are what servers read
    (path / "config.json").write_text(json.dumps(config_fields, indent=2) + "\n")


def convert_to_gguf(hf: Path, outfile: Path, llama_cpp: Path, pre: str) -> None:
    """llama.cpp's converter on `hf` (bf16 out), the pre-tokenizer lookup answered with `pre` (see the docstring)."""
    source = llama_cpp / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"llama.cpp's converter not found under {source}: run /work/shared/tools/build_llamacpp.sh")
    program = (
        "import sys\n"
        f"sys.path[:0] = [{str(source)!r}, {str(source / 'gguf-py')!r}]\n"
        "import convert_hf_to_gguf as converter\n"
        "from conversion.base import TextModel\n"
        f"TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--outtype', 'bf16', '--outfile', {str(outfile)!r}]\n"
        "converter.main()\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)


def quantize(source: Path, target: Path, gguf_type: str, llama_cpp: Path, threads: int) -> None:
    binary = llama_cpp / "bin" / "llama-quantize"
    if not binary.is_file():
        raise SystemExit(f"{binary} not found: run /work/shared/tools/build_llamacpp.sh")
    subprocess.run([str(binary), str(source), str(target), gguf_type, str(threads)], check=True,
                   stdout=subprocess.DEVNULL)


def make(name: str, out: Path, gguf_types: list[str], llama_cpp: Path, threads: int) -> None:
    config_fields, layout = MODELS[name]
    hf = hf_dir(out, name)
    started = time.monotonic()
    if not (hf / "model.safetensors").is_file() and not (hf / "model.safetensors.index.json").is_file():
        write_checkpoint(hf, config_fields, layout)
        print(f"{name}: checkpoint in {hf} ({time.monotonic() - started:.0f} s)", flush=True)
    missing = [t for t in gguf_types if not gguf_path(out, name, t).is_file()]
    if not missing:
        return
    bf16 = gguf_path(out, name, "BF16")
    if not bf16.is_file():
        convert_to_gguf(hf, bf16, llama_cpp, layout.llama_cpp_pre)
    for gguf_type in missing:
        quantize(bf16, gguf_path(out, name, gguf_type), gguf_type, llama_cpp, threads)
        print(f"{name}: {gguf_path(out, name, gguf_type)}", flush=True)
    if "BF16" not in gguf_types:
        bf16.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--gguf-types", default="Q4_0", help="llama-quantize types, comma-separated (BF16 keeps "
                        "the converter's file).")
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP,
                        help="build_llamacpp.sh's directory (bin/ and src/).")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    for name in names:
        make(name, args.out.expanduser(), args.gguf_types.split(","), args.llama_cpp.expanduser(), args.threads)


if __name__ == "__main__":
    main()
