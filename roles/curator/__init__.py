"""The curator: retros and curated knowledge (the knowledge pipeline comes with its own issue)."""
