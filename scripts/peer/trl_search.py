"""TRL's side of the multi-turn search workload of `scripts.bench.peer`: a `rollout_func` for TRL's GRPOTrainer.

TRL 1.16's own multi-turn interfaces, `tools=` and `environment_factory=`, need a chat template that
can render tool calls. The base Gemma 3 270M has no chat template, so TRL stops before training with
`ValueError: The provided chat template does not support tool calling. The template must be able to
render a full tool-calling conversation (user -> assistant with tool_calls -> tool).` Those interfaces
also write calls in the template's JSON format, not a recipe's `<search>` tags.

What is left in TRL for a custom environment is `rollout_func` (experimental), with `env_mask` marking
the tokens the policy did not write. `SearchRollout` is that loop, as a TRL user would write it:
- each turn, every unfinished episode generates in one batched `model.generate` call, with TRL's own
  sampling settings, as TRL's tool loop does;
- then all of that turn's searches go to the project's `/retrieve` (Search-R1's protocol) in one request;
- the recipe (`recipes/`) parses each turn, applies the turn limit and writes the observation, and
  searchrl's own `AgentLoop.fit_observation` shortens documents to the same token limits, as searchrl's
  agent loop does (`actors/rollout/agent_loop.py`).

Runs in TRL's virtual environment (`.venv-trl`), never in `.venv`: torch, transformers, trl and the
project's `recipes/` only; HTTP with the standard library.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from actors.rollout.agent_loop import AgentLoop, RolloutLimits
from recipes.base import Doc, Episode, Search


def retrieve(url: str, queries: list[str], topk: int, timeout_s: float = 60.0) -> list[list[Doc]]:
    """`POST {url}/retrieve` (Search-R1's protocol): one list of `topk` documents per query, best first.

    Sends `SEARCHRL_API_TOKEN` as a bearer token when it is set. Raises `urllib.error.URLError` (or
    `HTTPError`) when the server is unreachable or answers an error.
    """
    body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
    headers = {"Content-Type": "application/json"}
    if token := os.environ.get("SEARCHRL_API_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url.rstrip("/") + "/retrieve", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        rows = json.load(response)["result"]
    return [[search_r1_doc(item) for item in row] for row in rows]


def search_r1_doc(item: dict[str, Any]) -> Doc:
    """A Search-R1 `/retrieve` result item (`{"document": {"id", "contents"}, "score"}`, contents =
    '"title"\\ntext') as a recipe `Doc`."""
    doc = item["document"]
    title, _, text = doc["contents"].partition("\n")
    return Doc(str(doc["id"]), title.strip('"'), text, item.get("score"))


@dataclass
class _TokenizerOnly:
    """What `AgentLoop`'s token helpers read of an engine: its tokenizer."""

    tokenizer: Any


@dataclass
class _Run:
    """One episode between generate calls: its token ids and which of them the policy wrote."""

    episode: Episode
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 = policy token (in the loss), 0 = observation

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class SearchRollout:
    """A GRPOTrainer `rollout_func`: multi-turn episodes of `recipe` for a batch of prompts.

    Args:
        recipe: the method (`recipes.get_recipe`), e.g. Search-R1 with the F1 reward.
        rows: prompt text (as the dataset's `prompt` column holds it) → `{"question", "golden_answers"}`.
        tokenizer: the policy's tokenizer.
        url: the retrieval server's base URL, e.g. `http://127.0.0.1:8001`.
        limits: `max_new_tokens_per_turn`, `max_observation_tokens`, `max_total_tokens` (tokens).
        timing: a dict the loop adds `generate_s`, `search_s` (seconds), `tokens` (policy tokens),
            and `searches` to; the caller resets it each step.

    Returns from a call: `prompt_ids`, `completion_ids` (lists of token ids), `logprobs` (None: TRL's
    transformers path computes none either), `env_mask` (1 per policy token, 0 per observation token)
    and `searchrl_reward` (the recipe's reward per episode, for the reward function to return).
    """

    def __init__(self, recipe, rows: dict[str, dict], tokenizer, url: str, limits: dict[str, int], timing: dict):
        self.recipe, self.rows, self.tok, self.url = recipe, rows, tokenizer, url
        self.limits, self.timing = limits, timing
        # searchrl's own loop, for its token helpers only: the engine slot needs just a tokenizer
        self.loop = AgentLoop(_TokenizerOnly(tokenizer), recipe, searcher=None, limits=RolloutLimits(**limits),
                              chat=False)

    def __call__(self, prompts: list[Any], trainer) -> dict[str, Any]:
        import torch
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         generation_kwargs=trainer.generation_kwargs) as model, torch.no_grad():
            runs = self.run(model, [self.rows[p] for p in prompts], trainer.generation_config)
        rewards = [self.recipe.reward(r.episode).total for r in runs]
        return {"prompt_ids": [r.prompt_ids for r in runs], "completion_ids": [r.response_ids for r in runs],
                "logprobs": None, "env_mask": [r.env_mask for r in runs], "searchrl_reward": rewards}

    def run(self, model, rows: list[dict], generation_config) -> list[_Run]:
        """One episode per row (`question`, `golden_answers`; TRL's sampler already repeats each prompt
        num_generations times), turn by turn until every episode is done."""
        initial: list[list[Doc]] = [[] for _ in rows]
        if self.recipe.initial_search:  # the question's own top-k goes into the prompt (s3 §3.1's loop start)
            initial = self._search([r["question"] for r in rows])
        runs = []
        for row, docs in zip(rows, initial):
            episode = self.recipe.start(row["question"], row["golden_answers"], docs, chat=False)
            runs.append(_Run(episode, self.loop.encode(episode.prompt.render(None), special=True)))
        while active := [r for r in runs if not r.episode.done]:
            self._generate(model, active, generation_config)
            self._act(active)
        return runs

    def _generate(self, model, active: list[_Run], generation_config) -> None:
        """One turn for every active episode in a single left-padded `generate` call; each row is cut at
        its own token budget and after its first stop string or EOS, then parsed by the recipe."""
        import torch

        tok, lim = self.tok, self.limits
        budgets = [min(lim["max_new_tokens_per_turn"], lim["max_total_tokens"] - r.num_tokens) for r in active]
        forced = getattr(self.recipe.config, "forced_answer_tokens", None)
        budgets = [min(b, forced) if r.episode.answer_forced and forced else b for b, r in zip(budgets, active)]
        for r, b in zip(active, budgets):
            if b < 1:
                self.recipe.finish(r.episode, "max_total_tokens")
        rows = [(r, b) for r, b in zip(active, budgets) if b >= 1]
        if not rows:
            return
        seqs = [r.prompt_ids + r.response_ids for r, _ in rows]
        width = max(map(len, seqs))
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
        attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        t = time.perf_counter()
        out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=generation_config,
                             max_new_tokens=max(b for _, b in rows), stop_strings=list(self.recipe.stop_strings),
                             tokenizer=tok)
        self.timing["generate_s"] += time.perf_counter() - t
        eos = set(generation_config.eos_token_id if isinstance(generation_config.eos_token_id, list)
                  else [generation_config.eos_token_id])
        for (r, budget), new in zip(rows, out[:, width:].tolist()):
            ids, finish = [], "length"
            for token in new[:budget]:
                if token == pad:  # the row stopped earlier (stop string or EOS): the rest is padding
                    finish = "stop"
                    break
                ids.append(token)
                if token in eos:
                    finish = "stop"
                    break
            text = tok.decode(ids, skip_special_tokens=True)
            if finish == "length" and any(s in text for s in self.recipe.stop_strings):
                finish = "stop"  # the stop string completed on the budget's last token
            r.response_ids += ids
            r.env_mask += [1] * len(ids)
            self.timing["tokens"] += len(ids)
            self.recipe.step(r.episode, text, finish)

    def _search(self, queries: list[str]) -> list[list[Doc]]:
        """All queries in one `/retrieve` request, timed into `timing["search_s"]`."""
        t = time.perf_counter()
        hits = retrieve(self.url, queries, self.recipe.config.topk)
        self.timing["search_s"] += time.perf_counter() - t
        return hits

    def _act(self, active: list[_Run]) -> None:
        """Run this turn's searches in one `/retrieve` request, then append each observation (or the
        recipe's feedback) as non-policy tokens within the token limits."""
        searching = [r for r in active if r.episode.turns and r.episode.turns[-1].needs_retrieval]
        if searching:
            queries = []
            for r in searching:
                action = r.episode.turns[-1].action
                assert isinstance(action, Search)
                queries.append(action.query)
            self.timing["searches"] += len(queries)
            for r, docs in zip(searching, self._search(queries)):
                self.recipe.observe(r.episode, self.loop.fit_observation(docs))
        lim = self.limits
        for r in active:
            ep = r.episode
            turn = ep.turns[-1] if ep.turns else None
            if turn is not None and turn.observation:
                ids = self.loop.encode(turn.observation, special=False)
                if len(ids) > lim["max_observation_tokens"]:  # last resort after fit_observation, as searchrl's
                    ids = ids[: lim["max_observation_tokens"]]
                    turn.observation = self.loop.decode(ids)
                if r.num_tokens + len(ids) > lim["max_total_tokens"]:
                    turn.observation = ""
                    self.recipe.finish(ep, "max_total_tokens")
                    continue
                r.response_ids += ids
                r.env_mask += [0] * len(ids)
            if not ep.done and r.num_tokens >= lim["max_total_tokens"]:
                self.recipe.finish(ep, "max_total_tokens")
