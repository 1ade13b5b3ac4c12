"""Verifiable tasks: prompts, reward functions and a gold check, one task per file."""
