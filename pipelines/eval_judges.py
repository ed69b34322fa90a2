"""The papers' extra evaluation judges, asked through frozen LLM actors after the episodes ran:

- R1-Searcher's ACC_L (§3.1, LLM-as-Judge): the evaluation's judge model reads the paper's Judge
  Prompt (`recipes.metrics.acc_l_prompt`) for every answer; GPT-4o-mini in the paper.
- R-Search-as-a-Tool (RSTool, R-Search Fig. 2): the trained policy's evidence is handed to the frozen
  generator, which answers from it with the recipe's `evidence_prompt` (Table 5); the answers form the
  `rstool` method's records.
"""

from __future__ import annotations

import copy
from typing import Any


def acc_l_verdicts(ray: Any, judge: Any, records: list[dict]) -> list[bool]:
    """ACC_L per record (bool): the judge's verdict on each non-empty answer, False for an empty one.
    `judge`: a FrozenLLMWorker handle; records: evaluation records (question, golden_answers, answer)."""
    ask = [i for i, r in enumerate(records) if r["answer"] and r["answer"].strip()]
    verdicts = [False] * len(records)
    refs = [judge.acc_l.remote(records[i]["question"], list(records[i]["golden_answers"]), records[i]["answer"])
            for i in ask]
    for i, v in zip(ask, ray.get(refs)):
        verdicts[i] = bool(v)
    return verdicts


def rstool_records(ray: Any, generator: Any, policy_records: list[dict], evidence_prompt: str) -> list[dict]:
    """RSTool records: copies of the policy's records whose answer is the generator's, from the
    episode's evidence with `evidence_prompt` (an episode without evidence hands over an empty passage
    list, so the generator answers from the question alone, as the paper's "Vanilla" does)."""
    out = [copy.deepcopy(r) for r in policy_records]
    refs = [generator.generate_answer.remote(r["question"], r.get("evidence") or "", evidence_prompt) for r in out]
    for r, answer in zip(out, ray.get(refs)):
        r["answer"] = answer
    return out
