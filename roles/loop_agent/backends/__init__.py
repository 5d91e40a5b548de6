"""Act backends: how a loop-agent's act reaches a model (``anthropic``) or an agent CLI (``command``)."""
