"""The eval-agent: alone decides whether a goal is met (verification comes with the org issue)."""
