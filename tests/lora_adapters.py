"""Random PEFT LoRA adapters for tests, made BY peft on a tiny model, and peft's greedy output as the
oracle the shard is compared with (float32)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_random_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ALL_PROJECTIONS,
    use_rslora: bool = False,
    seed: int = 0,
    std: float = 0.3,
) -> Path:
    """A PEFT adapter directory for `model_dir` with random A and B (peft's default B is zero, which
    would make every adapter the base model)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=use_rslora, lora_dropout=0.0,
        init_lora_weights=False,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(out_dir)
    return out_dir


def peft_greedy(model_dir: Path, adapter_dir: Path | None, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """transformers (+ peft when `adapter_dir` is given) greedy continuation of `prompt`, float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens)
    return out[0, len(prompt) :].tolist()
