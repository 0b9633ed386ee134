"""`tgictl launch --kv-cache-dtype int8 --num-shard 2` on SmolLM2-135M, as a user runs it: two shards (tensor
parallel, each holding its KV heads' int8 pages), the router, HTTP and the `openai` client. The greedy answer is
right, a repeated prompt (read back from the prefix cache's int8 blocks) gives the same answer, and the prompt's
logprobs stay within 1% (perplexity) of a launch with the cache in the model's dtype."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import openai
from launch_procs import LaunchProc, start_launch

# A completion with one clear answer: the chat question "What is the capital of France?" opens on a near-tie
# ("The" at -1.88 against "L" at about -2.0 on a float32 cache), which a cache's rounding may flip.
PROMPT = "Question: What is the capital of France?\nAnswer: The capital of France is"
TEXT = "The capital of France is Paris. It lies on the Seine, and it is known for the Eiffel Tower and the Louvre."
ARGS = ("--kv-cache-memory", "64MiB", "--max-total-tokens", "1024")


def _prompt_logprobs(launch: LaunchProc, client: httpx.Client) -> list[float]:
    body = {"inputs": TEXT, "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True}}
    response = client.post(f"{launch.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return [t["logprob"] for t in response.json()["details"]["prefill"][1:]]


def test_an_int8_cache_over_two_shards_answers_and_keeps_perplexity(smollm2_dir: Path, tmp_path: Path) -> None:
    for name in ("int8", "auto"):
        (tmp_path / name).mkdir()
    int8 = start_launch(smollm2_dir, tmp_path / "int8", num_shard=2, extra_args=(*ARGS, "--kv-cache-dtype", "int8"))
    try:
        with httpx.Client() as http:
            int8.wait_healthy(http)
            chat = openai.OpenAI(base_url=f"{int8.url}/v1", api_key="-", max_retries=0)
            answers = [chat.completions.create(model="tgi", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
                       for _ in range(2)]
            assert "Paris" in answers[0]
            assert answers[1] == answers[0]  # the second read its prompt's blocks from the prefix cache
            quantized = _prompt_logprobs(int8, http)
    finally:
        int8.stop()
    reference_launch = start_launch(smollm2_dir, tmp_path / "auto", num_shard=1, extra_args=ARGS)
    try:
        with httpx.Client() as http:
            reference_launch.wait_healthy(http)
            reference = _prompt_logprobs(reference_launch, http)
    finally:
        reference_launch.stop()
    assert len(quantized) == len(reference) > 20
    ppl, ppl_reference = (math.exp(-sum(lps) / len(lps)) for lps in (quantized, reference))
    assert abs(ppl / ppl_reference - 1) < 0.01, (ppl, ppl_reference)
    assert quantized != reference
