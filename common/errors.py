"""Errors that say which request field is wrong, so every layer reports it without parsing text."""


class InvalidParameter(ValueError):
    """A request field breaks a rule. `param` is the field's name (the OpenAI error body's `param`; None when
    no one field is to blame); the message starts with it and says the rule and the value given."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def invalid(param: str, why: str) -> InvalidParameter:
    """'{param} {why}': the field, then what is wrong with it."""
    return InvalidParameter(param, f"{param} {why}")
