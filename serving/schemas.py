"""Request and response models of the searcher routes (pydantic, strict, unknown fields refused).

`parse_json(model, raw, limits)` validates a JSON body against a model with the per-deployment
limits as validation context and raises `ApiError(422)` naming the first bad field, e.g.
`"topk: got 0; expected an integer in 1..20 (retrieval.max_topk)"`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from serving.errors import ApiError


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "is empty or whitespace")
    return text


class Limits(BaseModel):
    """What requests may ask for, from the config: `max_turns` (recipe steps), `max_topk`
    (retrieval.max_topk), `max_timeout_s` (seconds, serve.request_timeout_s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_turns: int = 8
    max_topk: int = 100
    max_timeout_s: float = 300.0


def _ranged(value: Any, info: ValidationInfo, low: float, high_key: str, name: str) -> Any:
    """`value` if None or in [low, limits[high_key]], else a `range` error."""
    high = (info.context or {}).get(high_key)
    if value is not None and (value < low or (high is not None and value > high)):
        raise PydanticCustomError("range", "got {value}", {"value": value, "name": name})
    return value


class SearchOptions(BaseModel):
    """Per-request episode options shared by `/v1/search` and `/v1/chat/completions`."""

    model_config = ConfigDict(strict=True, extra="forbid")
    max_turns: int | None = Field(None, description="Searches before the last turn (0..serve limit); None = the recipe's.")
    topk: int | None = Field(None, description="Documents per search (1..retrieval.max_topk); None = retrieval.topk.")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature 0..2; None = the evaluation's (`eval.temperature`, 0 = greedy).")
    seed: int | None = Field(None, description="Sampling seed; None = the config's seed.")
    return_docs: bool = Field(True, description="Include each turn's documents in the response.")
    timeout_s: float | None = Field(None, gt=0, description="Deadline in seconds (0 < t <= serve.request_timeout_s); past it 504.")

    @field_validator("max_turns")
    @classmethod
    def _turns(cls, v, info):
        return _ranged(v, info, 0, "max_turns", "max_turns")

    @field_validator("topk")
    @classmethod
    def _topk(cls, v, info):
        return _ranged(v, info, 1, "max_topk", "topk")

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, v, info):
        return _ranged(v, info, 0.0, "max_timeout_s", "timeout_s")


class SearchRequest(SearchOptions):
    """Body of `POST /v1/search` and `POST /v1/search/stream`."""

    question: Annotated[str, AfterValidator(_not_blank)] = Field(..., description="The question (non-empty).")


class DocOut(BaseModel):
    """A retrieved document as the policy saw it (text may end in a truncation marker)."""

    id: str
    title: str
    text: str
    score: float | None


class TurnOut(BaseModel):
    """One policy turn: generated `text`, the parsed `action` (Search, Answer, Invalid, ...), and for
    a search its `query` and `docs` (None when `return_docs` is false)."""

    text: str
    action: str
    query: str | None = None
    docs: list[DocOut] | None = None


class ModelOut(BaseModel):
    """What answers: served name, checkpoint path (None for a model name), training step, recipe."""

    name: str
    checkpoint: str | None
    step: int | None
    recipe: str


class Usage(BaseModel):
    """Token counts of the episode: prompt, policy-generated, inserted observations; searches run."""

    prompt_tokens: int
    completion_tokens: int
    observation_tokens: int
    searches: int


class Timings(BaseModel):
    """Seconds: whole request, waiting for a searcher replica, in the engine, in retrieval."""

    total_s: float
    queue_s: float
    generate_s: float
    search_s: float


class SearchResponse(BaseModel):
    """Body of a `/v1/search` answer. `finish_reason`: the episode's stop reason ("answer", "complete",
    "max_turns", "invalid" for malformed model output, "max_total_tokens")."""

    id: str
    model: ModelOut
    answer: str | None
    finish_reason: str
    turns: list[TurnOut]
    usage: Usage
    timings: Timings


# ----------------------------------------------------------------------------- OpenAI chat


class TextPart(BaseModel):
    """An OpenAI content part of type text."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """An OpenAI chat message (string content or text parts)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (parts joined)."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    """OpenAI `stream_options`: `include_usage` adds a last chunk with `usage`."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatCompletionRequest(SearchOptions):
    """Body of `POST /v1/chat/completions`: OpenAI's fields this endpoint implements, plus the search
    options of `SearchOptions` (send them with the client's `extra_body`). The last user message is
    the question; other OpenAI fields are refused (422) rather than silently ignored."""

    model: str = Field(..., description="The served model id (GET /v1/models).")
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description="Choices; only 1.")
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, v):
        if v != 1:
            raise PydanticCustomError("range", "got {value}", {"value": v})
        return v

    def question(self) -> str:
        """The last user message's text.

        Raises:
            ApiError: 422 when there is no user message or it is blank.
        """
        users = [m for m in self.messages if m.role == "user"]
        if not users or not users[-1].text().strip():
            raise ApiError(422, "messages: no user message with text; expected the question as the last user message",
                           "messages")
        return users[-1].text()

    def options(self) -> SearchRequest:
        """The native request this chat request amounts to."""
        return SearchRequest.model_construct(question=self.question(), **{
            k: getattr(self, k) for k in SearchOptions.model_fields})


_EXPECTED = {
    "question": "a non-empty string",
    "max_turns": "an integer in 0..{max_turns} or omitted",
    "topk": "an integer in 1..{max_topk} (retrieval.max_topk) or omitted for retrieval.topk",
    "temperature": "a number in 0..2, or omitted for the evaluation's (greedy unless eval.temperature is set)",
    "seed": "an integer or omitted",
    "return_docs": "true or false",
    "timeout_s": "a number of seconds in (0, {max_timeout_s}] (serve.request_timeout_s) or omitted",
    "model": "the served model id (GET /v1/models)",
    "messages": "a non-empty list of {{role, content}} messages ending with the question as a user message",
    "stream": "true or false",
    "stream_options": '{{"include_usage": bool}}',
    "n": "1",
    "user": "a string",
    "body": "a JSON object",
}


def _where(loc: tuple) -> str:
    """A pydantic error location as `messages[0].content`; empty = the whole body."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)) or "body"


def parse_json(model: type[BaseModel], raw: bytes, limits: Limits) -> BaseModel:
    """Validate a JSON body against `model` with `limits` as the validation context.

    Raises:
        ApiError: 422 naming the first bad field and what it must be (with the count of further
            problems); an unknown field is named with the known ones.
    """
    ctx = limits.model_dump()
    try:
        return model.model_validate_json(raw or b"", context=ctx)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in ("str", "list[TextPart]")))
        where = _where(loc)
        field = str(loc[0]) if loc else "body"
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            known = ", ".join(model.model_fields)
            raise ApiError(422, f"{where}: unknown field; expected only {known}{more}", field) from None
        if err["type"] == "json_invalid" or not loc:
            raise ApiError(422, f"body: {err['msg']}{more}; expected a JSON object", "body") from None
        expected = _EXPECTED.get(field, "see the API schema").format(**ctx)
        raise ApiError(422, f"{where}: {err['msg']}{more}; expected {expected}", field) from None
