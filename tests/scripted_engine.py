"""A scripted policy for agent-loop tests: an Engine that emits given text token by token.

It follows vLLM's stop semantics (generation ends on the token that completes a stop string;
nothing after it is generated) and reports a fixed log-prob per token, so the loop's bookkeeping
can be checked exactly. It is a test double for the policy, not an inference engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from actors.engines.base import Generation, Sampling

LOGPROB = -0.25


class ScriptedEngine:
    """`policy(context_text) -> next turn text`; the context is the decoded prompt + response so far."""

    def __init__(self, tokenizer, policy: Callable[[str], str], eos: bool = False):
        self.tokenizer = tokenizer
        self.policy = policy
        self.eos = eos  # end a scripted text without a stop string with EOS
        self.weight_version = 0
        self.requests: list[tuple[list[int], Sampling]] = []

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[Generation]:
        self.requests.append((list(prompt_token_ids), sampling))
        await asyncio.sleep(0)  # let other episodes interleave, as a real async engine does
        context = self.tokenizer.decode(list(prompt_token_ids), skip_special_tokens=True)
        script = self.tokenizer.encode(self.policy(context), add_special_tokens=False)
        out: list[int] = []
        finish, stop_reason = "length", None
        for tok in script:
            if len(out) == sampling.max_tokens:
                break
            out.append(tok)
            text = self.tokenizer.decode(out, skip_special_tokens=True)
            hit = next((s for s in sampling.stop if s in text), None)
            if hit is not None:
                finish, stop_reason = "stop", hit
                break
        else:
            if self.eos and len(out) < sampling.max_tokens:
                out.append(self.tokenizer.eos_token_id)
                finish, stop_reason = "stop", self.tokenizer.eos_token_id
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        return [Generation(out, [LOGPROB] * len(out), finish, stop_reason, text)]

    async def update_weights(self, named_tensors, version: int) -> None:
        self.weight_version = version

    async def shutdown(self) -> None:
        pass


def turn_policy(turns_by_question: dict[str, list[str]]) -> Callable[[str], str]:
    """A policy that plays a fixed list of turns per question: the turn index is how many of the
    script's turns already appear, in order, after the question's last mention in the context."""

    def policy(context: str) -> str:
        for key, turns in turns_by_question.items():
            if key in context:
                pos = context.rfind(key) + len(key)
                i = 0
                while i < len(turns):
                    found = context.find(turns[i].strip(), pos)
                    if found < 0:
                        break
                    pos, i = found + len(turns[i].strip()), i + 1
                return turns[i] if i < len(turns) else "I have nothing more to say."
        return "no script for this question"

    return policy
