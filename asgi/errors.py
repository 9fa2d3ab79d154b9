"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: list | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or []

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message, param=None, code="invalid_value"):
    return ApiError(400, message, "invalid_request_error", param, code)


def unprocessable(message, param=None, code="invalid_type"):
    return ApiError(422, message, "invalid_request_error", param, code)


def unavailable(message, code="model_not_ready"):
    return ApiError(503, message, "server_error", None, code)
