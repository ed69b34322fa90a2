"""Tag helpers shared by the recipes' parsers: find `<tag>…</tag>` blocks in model output.

Plain string scanning (no regex backtracking), so arbitrary, unclosed or nested input costs O(n)
and never raises. A block is an opening tag followed by the nearest closing tag after it; when a
second opening tag comes before that close, the block starts at the innermost (last) opening tag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One `<tag>content</tag>` occurrence: `start`/`end` are character offsets of the whole block."""

    content: str
    start: int
    end: int


def find_blocks(text: str, open_tag: str, close_tag: str) -> list[Block]:
    """All complete blocks of one tag pair, in reading order; unclosed opening tags are ignored."""
    blocks: list[Block] = []
    pos = 0
    while True:
        close = text.find(close_tag, pos)
        if close < 0:
            return blocks
        start = text.rfind(open_tag, pos, close)
        if start >= 0:
            blocks.append(Block(text[start + len(open_tag) : close], start, close + len(close_tag)))
        pos = close + len(close_tag)


def first_block(text: str, open_tag: str, close_tag: str) -> Block | None:
    """The first complete block, or None."""
    blocks = find_blocks(text, open_tag, close_tag)
    return blocks[0] if blocks else None


def last_block(text: str, open_tag: str, close_tag: str) -> Block | None:
    """The last complete block, or None."""
    blocks = find_blocks(text, open_tag, close_tag)
    return blocks[-1] if blocks else None


def exactly_one_block(text: str, open_tag: str, close_tag: str) -> bool:
    """True when the text holds exactly one opening and one closing tag, in that order (R-Search Eq. 5)."""
    return text.count(open_tag) == 1 and text.count(close_tag) == 1 and text.find(open_tag) < text.find(close_tag)


def clean(content: str) -> str:
    """Strip whitespace and one pair of wrapping quotes, as models often quote queries and answers."""
    content = content.strip()
    if len(content) >= 2 and content[0] == content[-1] and content[0] in "\"'":
        content = content[1:-1].strip()
    return content
