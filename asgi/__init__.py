"""The raw ASGI HTTP app (OpenAI, LM Studio-style and native routes), no framework.

    granian --interface asgi asgi.app:app        (or: tinyloop serve)

app.py routes and answers errors; schema.py / fields.py validate bodies; prepare.py
turns them into engine requests; generation.py moves tokens from the engine thread to
the event loop (text, stop strings, disconnects); openai_routes.py and
native_routes.py shape responses and SSE; state.py holds the model and engine; drain.py
makes SIGTERM a bounded drain. OpenAI's Responses API (responses_*.py) and Anthropic's
Messages API (messages_*.py, anthropic_errors.py) turn their bodies into a Conversation
(conversation.py) on the chat path, and their replies into typed events
(reply_events.py, typed_events.py).
"""
