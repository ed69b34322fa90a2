"""What the run viewer (`scripts.view_run`) shows of a run directory, read from what the run
already wrote; pure Python, no Ray, no web framework (`serving.run_viewer` serves it).

    <run>/eval/predictions.jsonl      the evaluation's episodes (`pipelines.eval_rows.prediction_line`);
                                      an evaluation's own --out directory (predictions.jsonl at its top) too
    <run>/rollouts/step-<n>.jsonl.gz  a training step's rollouts (`Trajectory.to_json`, `save_rollouts`)
    <run>/metrics.jsonl               per-step metrics; its dev rows make the dev curve (`train_metrics.dev_curve`)
    <run>/reward_curves.png           the reward curves (`pipelines.tracking.plot_reward_curves`)

Any of them may be missing (a run still training has no eval/); `summary()` says which. EM, F1 and
cover-EM of an episode are computed here with `recipes.metrics`, as the evaluation's table does
(`predictions.jsonl` keeps the answer and the gold answers, not the scores).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines.run_docs import CorpusDocs, mark_gold, parse_context
from recipes.base import DOC_TEMPLATE
from recipes.metrics import cover_exact_match, exact_match, f1_score

MAX_PAGE = 200
"""Most episodes or rollouts one request returns (the page asks for fewer)."""

_STEP_FILE = re.compile(r"step-(\d+)\.jsonl\.gz\Z")


class RunViewError(ValueError):
    """A request the run cannot answer; `status`: the HTTP status it maps to (404 or 422)."""

    status = 422


class NotFound(RunViewError):
    """An unknown method, dataset, question, episode or step (404)."""

    status = 404


class BadRequest(RunViewError):
    """A malformed or out-of-range parameter (422)."""

    status = 422


def _finite(x: float) -> float | None:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _share(hits: Sequence[Any]) -> float | None:
    """The share of true values in `hits`; None when there are none (the method has no such measure)."""
    return sum(bool(h) for h in hits) / len(hits) if hits else None


def _scores(answer: str | None, golds: Sequence[str]) -> dict[str, float]:
    pred, golds = "" if answer is None else str(answer), list(golds)
    return {"em": exact_match(pred, golds), "f1": f1_score(pred, golds), "cover_em": cover_exact_match(pred, golds)}


def eval_dir(run_dir: Path) -> Path | None:
    """Where the run's predictions.jsonl is: `<run>/eval/`, or `run_dir` itself (an evaluation's --out); None."""
    for d in (run_dir / "eval", run_dir):
        if (d / "predictions.jsonl").is_file():
            return d
    return None


class RunView:
    """A run directory as the viewer shows it.

    Args:
        run_dir: the run directory (`runs/<run>`) or an evaluation's output directory.
        docs: where document ids become passages (`pipelines.run_docs.corpus_for`); None = ids only.
        doc_templates: the doc templates a generator's `context` may use (the recipe options'
            `doc_template`; `recipes.base.DOC_TEMPLATE` is always tried).
    Raises:
        FileNotFoundError: `run_dir` is not a directory.
    """

    def __init__(self, run_dir: str | Path, docs: CorpusDocs | None = None, doc_templates: Sequence[str] = ()):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"{self.run_dir}: not a directory; expected a run directory such as runs/<run>")
        self.docs = docs or CorpusDocs((), "document passages unavailable: no corpus given")
        self.templates = tuple(t for t in doc_templates if t) or (DOC_TEMPLATE,)
        self.eval_dir: Path | None = None
        self.episodes: list[dict[str, Any]] = []
        self.unreadable = 0  # predictions.jsonl lines that are not JSON objects (one being written)
        self._seen: tuple | None = None
        self.refresh()

    def refresh(self) -> None:
        """(Re)read predictions.jsonl when it appeared or changed since the last read (an evaluation that
        ends while the viewer runs); a line that is not a JSON object is counted in `unreadable`, not fatal."""
        d = eval_dir(self.run_dir)
        path = d / "predictions.jsonl" if d else None
        seen = (str(path), path.stat().st_mtime_ns, path.stat().st_size) if path else None
        if seen == self._seen:
            return
        episodes, bad = [], 0
        for line in (path.read_text(errors="replace").splitlines() if path else []):
            try:
                row = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                episodes.append(self._episode(len(episodes), row))
            else:
                bad += bool(line.strip())
        self.eval_dir, self.episodes, self.unreadable, self._seen = d, episodes, bad, seen

    @staticmethod
    def _episode(n: int, line: dict[str, Any]) -> dict[str, Any]:
        golds = [str(g) for g in line.get("golden_answers") or []]
        search = line.get("search") if isinstance(line.get("search"), dict) else {}
        return {**line, "n": n, "golden_answers": golds, "qid": str(line.get("id") or line.get("question", "")),
                "dataset": str(line.get("dataset", "")), "method": str(line.get("method", "")),
                # the search itself (recipes.search_metrics); None where the line has no `search` record
                "own_searches": search.get("own_searches"), "retrieval_hit": search.get("retrieval_hit"),
                "context_hit": search.get("context_hit"),
                **_scores(line.get("answer"), golds)}

    # ------------------------------------------------------------------ summary

    @property
    def methods(self) -> list[str]:
        """Evaluated methods, in predictions.jsonl's order (the evaluation's)."""
        return list(dict.fromkeys(e["method"] for e in self.episodes))

    @property
    def datasets(self) -> list[str]:
        """Datasets of the evaluated questions, sorted."""
        return sorted({e["dataset"] for e in self.episodes})

    def steps(self) -> list[int]:
        """Training steps with a rollouts file, ascending."""
        d = self.run_dir / "rollouts"
        found = [_STEP_FILE.match(p.name) for p in d.iterdir()] if d.is_dir() else []
        return sorted(int(m[1]) for m in found if m)

    def metrics_rows(self) -> list[dict[str, Any]]:
        """metrics.jsonl's rows (later rows win for a repeated step); [] without the file."""
        from pipelines.tracking import read_metrics

        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        try:
            return read_metrics(path)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):  # a line being written: keep the whole ones
            rows: dict[int, dict[str, Any]] = {}
            for line in path.read_text(errors="replace").splitlines():
                try:
                    row = json.loads(line)
                    rows[int(row["step"])] = row
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
            return [rows[k] for k in sorted(rows)]

    def reward_curves(self) -> Path | None:
        """`reward_curves.png`, or None when the run has not written it (it is drawn when training ends)."""
        from pipelines.tracking import REWARD_CURVE

        path = self.run_dir / REWARD_CURVE
        return path if path.is_file() else None

    def summary(self) -> dict[str, Any]:
        """What the run has: evaluation (methods with mean EM / F1 / cover-EM, datasets), rollout steps (with
        the step's `rollout/reward*` metrics), the dev curve, the reward-curve PNG, the documents' source, and
        `missing`: one sentence per part the run lacks."""
        from pipelines.train_metrics import dev_curve

        self.refresh()
        rows = self.metrics_rows()
        by_step = {int(r["step"]): r for r in rows}
        missing = []
        if self.eval_dir is None and (self.run_dir / "eval").is_dir():
            missing.append("evaluation not finished: eval/ has no predictions.jsonl yet (written when every method "
                           "is done; reload the page when it is there)")
        elif self.eval_dir is None:
            missing.append("no evaluation: eval/predictions.jsonl is not there (the main job writes it after "
                           "training; scripts.evaluate --out DIR writes DIR/predictions.jsonl)")
        steps = self.steps()
        if not steps:
            missing.append("no training rollouts: rollouts/step-<n>.jsonl.gz is not there (train.save_rollouts)")
        if not rows:
            missing.append("no metrics: metrics.jsonl is not there")
        elif not any("dev/answer_f1" in r for r in rows):
            missing.append("no dev curve: metrics.jsonl has no dev evaluation rows (dev/answer_f1)")
        if self.reward_curves() is None:
            missing.append("no reward_curves.png (drawn when training ends)")
        if self.unreadable:
            missing.append(f"{self.unreadable} line(s) of predictions.jsonl could not be read (not JSON)")
        if self.docs.problem:
            missing.append(self.docs.problem)
        methods = []
        for m in self.methods:
            eps = [e for e in self.episodes if e["method"] == m]
            searched = [e for e in eps if e.get("retrieval_hit") is not None]
            methods.append({"method": m, "episodes": len(eps),
                            **{k: sum(e[k] for e in eps) / len(eps) for k in ("em", "f1", "cover_em")},
                            "own_searches": (sum(e["own_searches"] or 0 for e in searched) / len(searched)
                                             if searched else None),
                            "retrieval_recall": _share([e["retrieval_hit"] for e in searched]),
                            "context_recall": _share([e["context_hit"] for e in eps if e.get("context_hit") is not None])})
        return {
            "run": self.run_dir.name, "path": str(self.run_dir),
            "eval": {"path": str(self.eval_dir) if self.eval_dir else None, "episodes": len(self.episodes),
                     "methods": methods, "datasets": self.datasets},
            "steps": [{"step": s, **{k: v for k, v in by_step.get(s, {}).items() if k.startswith("rollout/reward")}}
                      for s in steps],
            "dev_curve": [{k: _finite(v) for k, v in row.items()} for row in dev_curve(rows)],
            "reward_curves": self.reward_curves() is not None,
            "documents": {"corpus": self.docs.source, "problem": self.docs.problem},
            "missing": missing,
        }

    # ------------------------------------------------------------------ evaluation episodes

    def _check_method(self, method: str | None) -> None:
        if method is not None and method not in self.methods:
            known = ", ".join(self.methods) or "none (the run has no evaluation)"
            raise NotFound(f"method: {method!r} was not evaluated in this run; expected one of {known}")

    def _check_dataset(self, dataset: str | None) -> None:
        if dataset is not None and dataset not in self.datasets:
            known = ", ".join(self.datasets) or "none (the run has no evaluation)"
            raise NotFound(f"dataset: {dataset!r} has no evaluated question in this run; expected one of {known}")

    def list_episodes(self, method: str | None = None, dataset: str | None = None, f1_min: float = 0.0,
                      f1_max: float = 1.0, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """The evaluation's episodes with `method`, `dataset` (None = any) and answer F1 in [f1_min, f1_max],
        in predictions.jsonl's order: `{total, offset, limit, items}`, items without turns or documents.

        Raises:
            NotFound: an unknown method or dataset. BadRequest: F1 bounds outside [0, 1] or reversed, a
                negative offset, a limit outside 1..MAX_PAGE.
        """
        self.refresh()
        self._check_method(method)
        self._check_dataset(dataset)
        for name, v in (("f1_min", f1_min), ("f1_max", f1_max)):
            if not 0.0 <= v <= 1.0:
                raise BadRequest(f"{name}: got {v:g}; expected a number in 0..1 (answer F1)")
        if f1_min > f1_max:
            raise BadRequest(f"f1_min: got {f1_min:g} above f1_max {f1_max:g}; expected f1_min <= f1_max")
        _page(offset, limit)
        hits = [e for e in self.episodes if (method is None or e["method"] == method)
                and (dataset is None or e["dataset"] == dataset) and f1_min <= e["f1"] <= f1_max]
        keep = ("n", "method", "dataset", "qid", "question", "golden_answers", "answer", "em", "f1", "cover_em",
                "searches", "own_searches", "retrieval_hit", "finish_reason")
        return {"total": len(hits), "offset": offset, "limit": limit,
                "items": [{k: e.get(k) for k in keep} for e in hits[offset: offset + limit]]}

    def episode(self, n: int) -> dict[str, Any]:
        """Episode `n` (its 0-based line in predictions.jsonl) in full: each turn with its documents
        (`{id, title, text, score, found, gold}`), `context_docs` (what the frozen generator read: s3's
        selection, naive RAG's top-k; None when no generator answered), EM / F1 / cover-EM.

        Raises:
            NotFound: no such episode.
        """
        self.refresh()
        if not 0 <= n < len(self.episodes):
            raise NotFound(f"episode: {n} does not exist; expected 0..{len(self.episodes) - 1}" if self.episodes
                           else "episode: the run has no evaluation (eval/predictions.jsonl)")
        e = dict(self.episodes[n])
        golds = e["golden_answers"]
        if e.get("turns") is not None:
            e["turns"] = [{**t, "docs": mark_gold(self.docs.docs(t.get("doc_ids") or []), golds)} for t in e["turns"]]
        e["context_docs"] = mark_gold(parse_context(e.pop("context", None), self.templates), golds)
        return e

    def question(self, qid: str, dataset: str | None = None) -> dict[str, Any]:
        """One question's episodes across methods (side by side): `{qid, dataset, question, golden_answers,
        methods: {method: [episode, ...]}}`, episodes in full (`episode`). `dataset` picks among questions
        of several datasets that share an id.

        Raises:
            NotFound: no episode of that question (and dataset).
        """
        self.refresh()
        self._check_dataset(dataset)
        hits = [e for e in self.episodes if e["qid"] == qid and (dataset is None or e["dataset"] == dataset)]
        if not hits:
            raise NotFound(f"question: no evaluated question with id {qid!r}" + (f" in {dataset}" if dataset else ""))
        first = hits[0]
        by_method: dict[str, list[dict[str, Any]]] = {}
        for e in hits:
            by_method.setdefault(e["method"], []).append(self.episode(e["n"]))
        return {"qid": qid, "dataset": first["dataset"], "question": first.get("question"),
                "golden_answers": first["golden_answers"], "methods": by_method}

    # ------------------------------------------------------------------ training rollouts

    def rollouts(self, step: int, offset: int = 0, limit: int = 20) -> dict[str, Any]:
        """Training step `step`'s rollouts (`rollouts/step-<step>.jsonl.gz`), at most `limit` from `offset`:
        `{step, total, offset, limit, items}`; each item: question, gold answers, sample index, reward and
        its components, finish reason, final answer, EM / F1, turns with their documents and the selected
        documents (`final.selected_doc_ids`), each document marked `gold`. Token ids are left out.

        Raises:
            NotFound: the run has no rollouts file for `step`. BadRequest: offset / limit out of range.
        """
        _page(offset, limit)
        path = self.run_dir / "rollouts" / f"step-{step}.jsonl.gz"
        if not path.is_file():
            steps = self.steps()
            have = f"steps with rollouts: {', '.join(map(str, steps))}" if steps else "the run has no rollouts"
            raise NotFound(f"step: {step} has no rollouts ({path.name}); {have}")
        rows = _read_rollouts(str(path), path.stat().st_mtime_ns)
        items = []
        for t in rows[offset: offset + limit]:
            golds = [str(g) for g in t.get("golden_answers") or []]
            final = t.get("final") or {}
            items.append({
                "qid": t.get("qid"), "group_id": t.get("group_id"), "sample_index": t.get("sample_index"),
                "question": t.get("question"), "golden_answers": golds, "reward": t.get("reward"),
                "reward_components": t.get("reward_components") or {}, "finish_reason": t.get("finish_reason"),
                "answer": final.get("answer"), "answer_forced": final.get("answer_forced"),
                "evidence": final.get("evidence"), "timings": t.get("timings") or {},
                **_scores(final.get("answer"), golds),
                "turns": [{k: r.get(k) for k in ("text", "action", "query", "finish_reason", "generated_tokens")}
                          | {"docs": mark_gold(self.docs.docs(r.get("doc_ids") or []), golds)}
                          for r in t.get("turns") or []],
                "selected_docs": mark_gold(self.docs.docs(final.get("selected_doc_ids") or []), golds),
            })
        return {"step": step, "total": len(rows), "offset": offset, "limit": limit, "items": items}


def _page(offset: int, limit: int) -> None:
    if offset < 0:
        raise BadRequest(f"offset: got {offset}; expected an integer >= 0")
    if not 1 <= limit <= MAX_PAGE:
        raise BadRequest(f"limit: got {limit}; expected an integer in 1..{MAX_PAGE}")


@lru_cache(maxsize=4)
def _read_rollouts(path: str, mtime_ns: int) -> list[dict[str, Any]]:
    """A rollouts file's trajectories without their token arrays (cached by path and modification time)."""
    drop = ("prompt_ids", "response_ids", "loss_mask", "logprobs", "token_versions")
    rows = []
    try:
        with gzip.open(path, "rt") as f:
            for line in f:
                row = json.loads(line) if line.strip() else None
                if isinstance(row, dict):
                    rows.append({k: v for k, v in row.items() if k not in drop})
    except (OSError, EOFError, json.JSONDecodeError):
        pass  # a file still being written: the whole lines before its end
    return rows
