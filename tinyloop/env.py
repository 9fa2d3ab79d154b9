"""Reading on/off settings from the environment, strictly (a typo is an error, not "off")."""
from __future__ import annotations

from tinyloop.errors import TinyLoopError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


def env_flag(env, name: str, default: bool = False) -> bool:
    """A yes/no variable: `default` when unset or empty (as env_number); 1/0 and their
    spellings in TRUE/FALSE; anything else is a TinyLoopError naming the variable."""
    value = env.get(name)
    if value is None or value == "":
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise TinyLoopError(f"{name} must be 1 or 0, got {value!r}")


def env_number(env, name: str, default, parse, what: str, allowed, requirement: str):
    """A number from the environment: `default` when unset or empty; a TinyLoopError naming
    the variable when it does not parse (`what` it must be) or `allowed(number)` is false
    (`requirement` says what is allowed)."""
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        number = parse(value)
    except ValueError:
        raise TinyLoopError(f"{name} must be {what}, got {value!r}") from None
    if not allowed(number):
        raise TinyLoopError(f"{name} must be {requirement}, got {value!r}")
    return number
