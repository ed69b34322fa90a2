"""Serving the trained searcher on Ray Serve.

- `schemas.py`: request/response models (strict, unknown fields refused) and `parse_json` (422 naming the field).
- `errors.py`: `ApiError` (the JSON error answer) and the errors replicas raise (deadline, overload, too long).
- `auth.py`: the bearer token of `SEARCHRL_API_TOKEN`.
- `searcher.py`: `SearchService`, one question = one evaluation episode on the project's agent loop (no Ray).
- `openai_compat.py`: chat completions, streamed chunks and the model list in OpenAI's format.
- `api.py`: the FastAPI routes over a `Backend`.
- `app.py`: the Ray Serve deployments (Searcher, Retrieval, Generator, Ingress) and `build_app`.
- `checkpoint.py`: what `--checkpoint PATH` names (run directory, step directory, model directory or name).
- `playground.py`: `GET /`, the page that asks the searcher a question and shows its episode.
- `run_viewer.py`: the run viewer's app (`scripts.view_run`) over `pipelines.run_view`.
- `static/`: the two pages' HTML, script and style (no build step; text nodes only, never HTML from data).
"""
