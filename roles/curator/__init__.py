"""The curator: retros, curated knowledge, skill candidates and review batches (roles/curator/pipeline.py)."""
