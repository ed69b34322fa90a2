"""`EvalWorker`: a RolloutWorker for evaluation: one greedy episode per question, no reward, and
each episode's final output as evaluation scores it (`Trajectory.to_json` drops the Episode,
hence the s3 documents)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.rollout.worker import RolloutWorker


class EvalWorker(RolloutWorker):
    """A `RolloutWorker` whose `run_final` returns final outputs instead of trajectories."""

    async def run_final(
        self,
        examples: Sequence[Mapping[str, Any]],
        recipe: str,
        *,
        recipe_config: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        chat: bool | None = None,
        expert: bool = False,
    ) -> list[dict[str, Any]]:
        """One episode per example, no reward. Returns per example `{id, dataset, question,
        golden_answers, answer, context, evidence, searches, finish_reason, answer_forced, turns}`:
        `turns` are the episode's generation turns ({text, action, query, doc_ids, finish_reason}: what
        a reader needs to see why an answer was wrong); `context` is the
        formatted selected documents for recipes whose frozen generator answers
        (`Recipe.generator_answers`, else None); `evidence` the episode's evidence (R-Search's
        `<original_evidence>`, else None); `searches` counts retrieval calls, the initial top-k included;
        `search` is the episode's `recipes.search_metrics.SearchRecord` as a dict (own searches, the shown doc
        ids, whether they hold a gold answer, gold-paragraph recall), None for a recipe that never retrieves.
        `expert`: the recipe's rule-based expert writes the turns (`AgentLoop(expert=True)`; the engine never
        generates): an episode it cannot demonstrate has `answer` None and `finish_reason` saying why."""
        loop = await self.agent_loop(recipe, recipe_config, sampling, limits, chat, compute_reward=False,
                                     expert=expert)
        rec = loop.recipe
        trajs = await loop.run_batch(list(examples), 1)
        out = []
        for ex, t in zip(examples, trajs):
            ep = t.episode
            final = ep.final or rec.final_output(ep)
            out.append({
                "id": str(ex.get("id", "")), "dataset": str(ex.get("dataset", "")), "question": ep.question,
                "golden_answers": list(ep.golden_answers), "answer": final.answer,
                "context": rec.format_docs(final.selected_docs) if rec.generator_answers else None,
                "evidence": final.evidence,
                "searches": ep.num_searches + int(rec.initial_search), "finish_reason": ep.stop_reason,
                "answer_forced": ep.answer_forced,
                # the search itself (recipes.search_metrics); None for a recipe that never retrieves (direct)
                "search": t.final.get("search") if rec.retrieves else None,
                "turns": [{"text": r.text, "action": r.action, "query": r.query, "doc_ids": list(r.doc_ids),
                           "finish_reason": r.finish_reason} for r in t.turns],
            })
        return out
