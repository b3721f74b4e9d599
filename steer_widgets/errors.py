"""Errors users see. Each names the field or source at fault, so a widget can show it."""

from __future__ import annotations


class SteerWidgetsError(Exception):
    """Base class: anything raised on purpose by steer_widgets."""


class RequestError(SteerWidgetsError, ValueError):
    """A request field is invalid. Raised before any generation starts."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class SourceError(SteerWidgetsError, ValueError):
    """An SAE source cannot be loaded or does not fit the model."""

    def __init__(self, source: str, problem: str) -> None:
        self.source, self.problem = source, problem
        super().__init__(f"SAE source {source!r}: {problem}")
