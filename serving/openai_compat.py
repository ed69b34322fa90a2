"""OpenAI wire format of the searcher: chat completions, streamed chunks and the model list.

The answer is `choices[0].message.content`. OpenAI's `finish_reason` is "stop" for an episode that
ended by itself (answer, search complete, or malformed output) and "length" for one a limit ended
(max_turns, max_total_tokens); the episode's own reason, the turns, usage and timings are in the
extra field `search` (the `openai` client keeps unknown fields: `completion.search` or
`completion.model_extra["search"]`). `usage.completion_tokens` counts policy tokens; observation
tokens are in `search.usage`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from serving.errors import ApiError
from serving.schemas import ModelOut

_LENGTH = {"max_turns", "max_total_tokens"}


def finish_reason(episode_reason: str) -> str:
    """OpenAI's finish_reason for an episode's stop reason."""
    return "length" if episode_reason in _LENGTH else "stop"


def usage(resp: dict) -> dict:
    """OpenAI `usage` of a `SearchResponse` dict."""
    u = resp["usage"]
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


def trace(resp: dict) -> dict:
    """The `search` extra field: the episode's finish reason, turns, usage and timings."""
    return {k: resp[k] for k in ("id", "finish_reason", "turns", "usage", "timings")}


def completion(resp: dict) -> dict:
    """A `chat.completion` object for a `SearchResponse` dict."""
    return {
        "id": resp["id"], "object": "chat.completion", "created": int(time.time()), "model": resp["model"]["name"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": resp["answer"] or ""},
                     "finish_reason": finish_reason(resp["finish_reason"]), "logprobs": None}],
        "usage": usage(resp), "search": trace(resp),
    }


def _chunk(request_id: str, model: str, delta: dict, reason: str | None = None, **extra: Any) -> str:
    body = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}], **extra}
    return f"data: {json.dumps(body)}\n\n"


async def chunks(events: AsyncIterator[tuple[str, Any]], request_id: str, model: str,
                 include_usage: bool = False) -> AsyncIterator[str]:
    """`chat.completion.chunk` SSE lines for an episode's events: the assistant role first, one chunk
    per turn with an empty delta and the turn in `search_turn`, the answer as content, the finish
    reason (with the `search` trace), a usage chunk when asked, then `data: [DONE]`. An
    `("error", ApiError)` event becomes `data: {"error": ...}` and ends the stream."""
    yield _chunk(request_id, model, {"role": "assistant", "content": ""})
    async for kind, payload in events:
        if kind == "turn":
            yield _chunk(request_id, model, {}, search_turn=payload)
        elif kind == "error":
            body = payload.body() if isinstance(payload, ApiError) else {"error": {"message": str(payload)}}
            yield f"data: {json.dumps(body)}\n\n"
            return
        elif kind == "answer":
            if payload["answer"]:
                yield _chunk(request_id, model, {"content": payload["answer"]})
            yield _chunk(request_id, model, {}, finish_reason(payload["finish_reason"]), search=trace(payload))
            if include_usage:
                body = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": model, "choices": [], "usage": usage(payload)}
                yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


def model_list(model: ModelOut) -> dict:
    """`GET /v1/models`: the one served model, with its checkpoint, step and recipe."""
    return {"object": "list", "data": [{"id": model.name, "object": "model", "created": 0, "owned_by": "searchrl",
                                        "checkpoint": model.checkpoint, "step": model.step, "recipe": model.recipe}]}
