"""Search-agent methods as pure Python (no Ray, no engine): prompts, action parsers, rewards. Filled in by the recipes issue."""
