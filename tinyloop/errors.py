"""Exceptions with messages meant for users: each says what was wrong and what is allowed."""


class TinyLoopError(Exception):
    """Base class of every error TinyLoop raises on purpose."""


class ConfigError(TinyLoopError, ValueError):
    """A model config field is missing, of the wrong type, or out of range."""


class ModelFileError(TinyLoopError):
    """A .tinyloop file is unreadable, corrupt, or does not match its config."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class RequestError(TinyLoopError, ValueError):
    """A generation request asks for something the model or engine cannot do."""

    def __init__(self, message: str, param: str | None = None):
        self.param = param
        super().__init__(message)
