"""A user recipe named by import path (`train.recipe: tests.scripted_recipe:ParityReward`): Search-R1's
prompt and loop with a scripted reward, so a random tiny policy gets a learning signal."""

from __future__ import annotations

import zlib

from recipes.base import Episode, RewardBreakdown, Scorer
from recipes.search_r1 import SearchR1


class ParityReward(SearchR1):
    """Reward 1.0 when the CRC-32 of the policy's generated text is odd, else 0.0: a deterministic
    function of the sampled tokens that splits a group of random episodes about evenly."""

    name = "parity_reward"

    def reward(self, episode: Episode, scorer: Scorer | None = None) -> RewardBreakdown:
        value = float(zlib.crc32(episode.generated_text.encode()) % 2)
        return RewardBreakdown(value, {"parity": value})
