"""The HTTP comparison: `tinyloop serve` against a FastAPI + uvicorn + sse-starlette app
calling the same engine, under the same bounded load (compare.py)."""
