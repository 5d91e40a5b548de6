"""The price table, as the act backends use it: ``state_db.kernel.pricing`` (shared with the eval-agent's
review), with its errors raised as backend configuration errors."""
from __future__ import annotations

from roles.loop_agent.backends.base import BackendConfigError
from state_db.kernel import pricing as _shared
from state_db.kernel.pricing import PRICE_FIELDS, Price

__all__ = ["PRICE_FIELDS", "Price", "PriceTable", "PricingError"]


class PricingError(BackendConfigError, _shared.PricingError):
    """The price table is malformed or lacks a model (codes ``bad_price_table``, ``unknown_model``)."""

    code = "bad_price_table"


class PriceTable(_shared.PriceTable):
    error = PricingError
