"""The demos ``scripts/start-org --demo`` runs (fix, learning).
"""
