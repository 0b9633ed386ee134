"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): its bodies (schemas.py), their
translation into a chat turn and of the answer into Anthropic's blocks and stream events (translate.py),
and the routes (routes.py). docs/apis.md says what is supported."""
