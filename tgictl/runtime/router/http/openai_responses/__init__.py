"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}): its bodies (schemas.py), their
translation into a chat turn and of the answer into output items and stream events (translate.py), the
bounded in-memory store behind `previous_response_id` (store.py), and the routes (routes.py)."""
