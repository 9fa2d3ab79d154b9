"""The raw ASGI HTTP app (OpenAI, LM Studio-style and native routes).

Not built yet: the HTTP server is its own issue. Until it lands, use the
`tinyloop generate` command line.
"""
