"""Errors of the searcher routes and their HTTP answers.

`ApiError(status, message, param)` is what a route answers with: `{"detail": message, "error":
{"message", "type", "param", "code"}}` (FastAPI's `detail` and OpenAI's `error` object, so curl users
and the `openai` client both read it). Replicas raise the typed errors below; `ApiError.of` maps them.
"""

from __future__ import annotations

from collections.abc import Mapping


class ApiError(Exception):
    """An HTTP error answer. `param`: the request field at fault (None = not one field)."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             408: "timeout_error", 413: "invalid_request_error", 422: "invalid_request_error",
             503: "overloaded_error", 504: "timeout_error"}

    def __init__(self, status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """The JSON answer."""
        kind = self.TYPES.get(self.status, "server_error")
        return {"detail": self.message,
                "error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


class QuestionTooLongError(ValueError):
    """The question has more tokens than serve.max_question_tokens (answers 422)."""


class DeadlineError(TimeoutError):
    """The request ran past its deadline (answers 504)."""


class OverloadedError(RuntimeError):
    """Every searcher replica is busy and the queue is full (answers 503 with Retry-After)."""


class UnavailableError(RuntimeError):
    """A deployment is not ready or its replica died mid-request (answers 503 with Retry-After)."""
