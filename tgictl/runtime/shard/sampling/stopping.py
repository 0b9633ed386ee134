"""When a request stops on the shard: EOS ids and max_new_tokens (stop strings live in the router).

TGI's order is kept (TGI's StoppingCriteria, utils/tokens.py): after counting the new token, LENGTH is checked first, so a
request whose last allowed token is also an EOS token finishes with LENGTH; EOS is only checked when
the request does not ignore it. The EOS ids are the model's (ModelConfig.eos_token_ids gathers
config.json's and generation_config.json's, which is where chat models declare their end of turn).
"""

from __future__ import annotations

from tgictl.proto.messages import FinishReason


def finish_reason(
    generated_tokens: int, token_id: int, max_new_tokens: int, ignore_eos: bool, eos_token_ids: frozenset[int]
) -> FinishReason | None:
    """Why a request stops after its `generated_tokens`-th token `token_id` (counted), or None."""
    if generated_tokens >= max_new_tokens:
        return FinishReason.LENGTH
    if not ignore_eos and token_id in eos_token_ids:
        return FinishReason.EOS_TOKEN
    return None
