"""The scripted model: a local Anthropic-compatible server replaying a script file."""
