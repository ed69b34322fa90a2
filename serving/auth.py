"""Bearer-token check of the searcher routes.

When `SEARCHRL_API_TOKEN` is set (read when the app is built), every route but `/health` needs
`Authorization: Bearer <token>`; without it, or with another token, the answer is 401. Unset, the
routes are open: keep `serve.host` at 127.0.0.1 then (the default), and set the token whenever the
server binds an address other machines reach.
"""

from __future__ import annotations

import hmac
import os

from serving.errors import ApiError

TOKEN_ENV = "SEARCHRL_API_TOKEN"


def token_from_env() -> str | None:
    """The configured token, or None (unset or empty: no auth)."""
    return os.environ.get(TOKEN_ENV) or None


def auth_headers(token: str | None = None) -> dict[str, str]:
    """Headers a client of this server sends: `Authorization: Bearer <token>` with `token` or, when
    None, `SEARCHRL_API_TOKEN` from the environment; {} when neither is set (an open server)."""
    token = token or token_from_env()
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_bearer(authorization: str | None, token: str | None) -> None:
    """Accept the `Authorization` header value when `token` is None or it is `Bearer <token>`.

    Raises:
        ApiError: 401 (with `WWW-Authenticate: Bearer`) otherwise; the comparison takes the same time
            whatever the header holds (hmac.compare_digest).
    """
    if token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(401, f"authorization: missing or wrong bearer token; expected 'Authorization: Bearer <token>' "
                            f"with the server's {TOKEN_ENV}", "authorization", {"WWW-Authenticate": "Bearer"})
