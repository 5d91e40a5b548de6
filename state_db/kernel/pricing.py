"""Cost of model calls from a price table (USD per million tokens): shared by every role that
calls a model (the doer's backends, the eval-agent's review), so it lives in the state layer.

The table comes from configuration as ``{model: {input, output, cache_write, cache_read}}``.
A model missing from the table is a configuration error (an unknown price must never silently
count as free); an explicit 0 is allowed, e.g. for local models or the scripted demo.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from state_db.kernel.errors import StateError

PRICE_FIELDS = ("input", "output", "cache_write", "cache_read")
_PER = 1_000_000


class PricingError(StateError):
    """The price table is malformed or lacks a model (codes ``bad_price_table``, ``unknown_model``)."""

    code = "bad_price_table"


@dataclass(frozen=True)
class Price:
    """USD per million tokens of each kind."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    def cost(self, *, input_tokens: int, output_tokens: int,
             cache_creation_input_tokens: int = 0, cache_read_input_tokens: int = 0) -> float:
        """USD for one call; the API's ``input_tokens`` already exclude cached tokens."""
        return (input_tokens * self.input + output_tokens * self.output
                + cache_creation_input_tokens * self.cache_write
                + cache_read_input_tokens * self.cache_read) / _PER


class PriceTable:
    """Validated price table.

    Params: ``table`` maps model name → mapping with the four ``PRICE_FIELDS`` (non-negative
    numbers). Errors: ``PricingError`` (code ``bad_price_table``) naming the model and field; a
    subclass may name its own ``error`` class (a subclass of ``PricingError``).
    """

    error: type[PricingError] = PricingError

    def __init__(self, table: Mapping[str, Mapping[str, float]]) -> None:
        if not isinstance(table, Mapping):
            raise self.error("price table must be a mapping of model name to prices")
        self._prices: dict[str, Price] = {}
        for model, row in table.items():
            self._prices[str(model)] = _parse_row(str(model), row, self.error)

    def __contains__(self, model: str) -> bool:
        return model in self._prices

    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._prices))

    def price(self, model: str) -> Price:
        """Price of ``model``. Errors: ``PricingError`` code ``unknown_model``."""
        try:
            return self._prices[model]
        except KeyError:
            known = ", ".join(self.models()) or "none"
            raise self.error(
                f"model {model!r} has no entry in the price table (known: {known}); add "
                f"[prices.{model!r}] with input/output/cache_write/cache_read (0 is allowed)",
                code="unknown_model",
            ) from None

    def cost(self, model: str, *, input_tokens: int, output_tokens: int,
             cache_creation_input_tokens: int = 0, cache_read_input_tokens: int = 0) -> float:
        """USD for one call of ``model``. Errors: ``PricingError`` code ``unknown_model``."""
        return self.price(model).cost(
            input_tokens=input_tokens, output_tokens=output_tokens,
            cache_creation_input_tokens=cache_creation_input_tokens,
            cache_read_input_tokens=cache_read_input_tokens)


def _parse_row(model: str, row: object, error: type[PricingError] = PricingError) -> Price:
    if not isinstance(row, Mapping):
        raise error(f"price table entry for {model!r} must be a mapping of {PRICE_FIELDS}")
    values = {}
    for name in PRICE_FIELDS:
        if name not in row:
            raise error(f"price table entry for {model!r} lacks {name!r} (USD per million tokens)")
        value = row[name]
        # bool is an int subclass; True as a price is a typo, not a number
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise error(
                f"price table entry {model!r}.{name} must be a non-negative number, got {value!r}")
        values[name] = float(value)
    extra = set(row) - set(PRICE_FIELDS)
    if extra:
        raise error(f"price table entry for {model!r} has unknown fields {sorted(extra)}")
    return Price(**values)
