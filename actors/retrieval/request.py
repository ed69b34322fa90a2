"""The one validator of a retrieval request: `RetrieveRequest` (pydantic) with the limits of a
`RetrievalConfig`. The HTTP route checks its JSON body with `parse_body`, the pool its Python call with
`check_search`; both raise `RetrievalRequestError` with the same text:
`"<field>: <problem>; expected <allowed range>"`, e.g. `"topk: got 0; expected an integer in 1..100 ..."`.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from actors.retrieval.shard import RetrievalRequestError


class MalformedBodyError(RetrievalRequestError):
    """The request body is not JSON at all (HTTP 400; every other violation is a 422)."""


def _not_blank(query: str) -> str:
    if not query.strip():
        raise PydanticCustomError("blank_query", "is empty or whitespace")
    return query


class RetrieveRequest(BaseModel):
    """A search request (the body of `POST /retrieve`). Strict: no type coercion, no unknown fields.

    Validated with a `RetrievalConfig` dict as the validation context (`parse_body`, `check_search`),
    the query count is checked against `max_queries_per_request` and `topk` against `max_topk`.
    """

    model_config = ConfigDict(strict=True, extra="forbid")
    queries: list[Annotated[str, AfterValidator(_not_blank)]] = Field(
        description="Queries (non-empty strings), at most retrieval.max_queries_per_request."
    )
    topk: int | None = Field(None, description="Passages per query, 1..retrieval.max_topk; None = retrieval.topk.")
    return_scores: bool = Field(True, description="Items carry a score (else bare documents).")

    @field_validator("queries")
    @classmethod
    def _query_count(cls, queries: list[str], info: ValidationInfo) -> list[str]:
        limit = (info.context or {}).get("max_queries_per_request")
        if not queries or (limit is not None and len(queries) > limit):
            raise PydanticCustomError("query_count", "got {n} queries", {"n": len(queries)})
        return queries

    @field_validator("topk")
    @classmethod
    def _topk_range(cls, topk: int | None, info: ValidationInfo) -> int | None:
        limit = (info.context or {}).get("max_topk")
        if topk is not None and (topk < 1 or (limit is not None and topk > limit)):
            raise PydanticCustomError("topk_range", "got {topk}", {"topk": topk})
        return topk

    def k(self, retrieval: dict) -> int:
        """Passages per query: `topk`, or `retrieval["topk"]` when it was omitted."""
        return self.topk if self.topk is not None else retrieval["topk"]


def expected(field: str, retrieval: dict) -> str:
    """What `field` (a top-level field, "body", or anything else = an unknown field) must be, with its limits."""
    limit = retrieval["max_queries_per_request"]
    return {
        "body": 'a JSON object {"queries": [str, ...], "topk": int, "return_scores": bool}',
        "queries": f"a non-empty list of 1..{limit} non-empty strings "
        f"(at most {limit}: retrieval.max_queries_per_request)",
        "topk": f"an integer in 1..{retrieval['max_topk']} (retrieval.max_topk), or omitted for "
        f"retrieval.topk={retrieval['topk']}",
        "return_scores": "true or false",
    }.get(field, "only the fields queries, topk, return_scores")


def _where(loc: tuple) -> str:
    """Pydantic error location as `queries[2]`; the empty location is the whole body."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)) or "body"


def _validate(data: Any, retrieval: dict, json: bool) -> RetrieveRequest:
    """`RetrieveRequest` from JSON text (`json`) or Python data, checked against `retrieval`'s limits.

    Raises:
        RetrievalRequestError: the first problem as `"<field>: <problem>; expected <allowed>"` (with the
            number of further problems); `MalformedBodyError` when `data` is not JSON.
    """
    try:
        if json:
            return RetrieveRequest.model_validate_json(data, context=retrieval)
        return RetrieveRequest.model_validate(data, context=retrieval)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]  # the first problem, named precisely
        where = _where(tuple(err["loc"]))
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        error = MalformedBodyError if err["type"] == "json_invalid" else RetrievalRequestError
        field = where.split("[")[0].split(".")[0]
        raise error(f"{where}: {err['msg']}{more}; expected {expected(field, retrieval)}") from None


def parse_body(raw: bytes | str, retrieval: dict) -> RetrieveRequest:
    """Validate a `POST /retrieve` JSON body against `retrieval` (a `RetrievalConfig` dict: max_topk,
    max_queries_per_request, topk).

    Raises:
        MalformedBodyError: the body is not JSON.
        RetrievalRequestError: any other violation, naming the field and its allowed range.
    """
    return _validate(raw, retrieval, json=True)


def check_search(queries: Any, k: Any, retrieval: dict) -> tuple[list[str], int]:
    """Validate a pool call `search(queries, k)` with the same rules as `parse_body` (a tuple of queries and
    a numpy integer k are accepted as a list and an int; k None = `retrieval["topk"]`).

    Returns:
        (queries as a list, k as an int).
    Raises:
        RetrievalRequestError: malformed queries or k, naming the field (`queries[i]`, `topk`) and the range.
    """
    queries = list(queries) if isinstance(queries, tuple) else queries
    k = int(k) if isinstance(k, np.integer) else k
    req = _validate({"queries": queries, "topk": k}, retrieval, json=False)
    return req.queries, req.k(retrieval)


def check_vector_search(vectors: Any, k: Any, dim: int | None, retrieval: dict) -> tuple[np.ndarray, int]:
    """Validate a pool call `search_vectors(vectors, k)`: `vectors` a real-valued `[n, dim]` array of finite
    numbers with n in 1..`max_queries_per_request`; k as for `check_search`.

    Returns:
        (the vectors as float32 `[n, dim]`, k as an int).
    Raises:
        RetrievalRequestError: the index holds no vectors (`dim` None: BM25), or a wrong shape, dtype, count,
            a NaN/inf value or a bad k, naming the field (`vectors`, `topk`) and what is expected.
    """
    limit = retrieval["max_queries_per_request"]
    want = f"expected a float array [n, {dim}] with n in 1..{limit} (retrieval.max_queries_per_request)"
    if dim is None:
        raise RetrievalRequestError("vectors: this index is BM25 and searches text; call search(queries, k)")
    arr = np.asarray(vectors)
    if arr.ndim != 2 or arr.shape[1] != dim or not 1 <= arr.shape[0] <= limit:
        raise RetrievalRequestError(f"vectors: got shape {list(arr.shape)}; {want}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise RetrievalRequestError(f"vectors: got dtype {arr.dtype}; {want}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise RetrievalRequestError(f"vectors: holds NaN or inf; {want}")
    _, k = check_search(["vector"], k, retrieval)  # topk: the same rules and message as a text search
    return arr, k
