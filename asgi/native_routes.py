"""TinyLoop-native routes: /generate, /generate/speculative, /generate/tree_speculative."""
from __future__ import annotations

from .fields import NATIVE, NATIVE_SPECULATIVE, NATIVE_TREE
from .generation import Generation
from .http import EventStream, send_json
from .openai_routes import stats
from .prepare import prepare_native
from .schema import validate

FIELDS = {"generate": NATIVE, "speculative": NATIVE_SPECULATIVE, "tree_speculative": NATIVE_TREE}


async def native_generate(request, mode: str = "generate"):
    values = validate(await request.json(), FIELDS[mode])
    generation = Generation(request, prepare_native(request.state, values, mode))
    generation.submit()
    if values["stream"]:
        stream = EventStream(request.send)
        request.stream = stream
        await stream.start()
        tail = ""
        async for batch in generation.batches():
            events = []
            for token_id, text in batch:
                if token_id is None:
                    tail = text
                else:
                    events.append({"token_id": token_id, "text": text})
            await stream.events(events)
        outcome = generation.outcome
        await stream.event({"token_id": -1, "text": tail, "finish_reason": outcome.finish_reason,
                            "stats": stats(outcome)})
        await stream.done()
        return
    tokens, text = await generation.text()
    outcome = generation.outcome
    await send_json(request.send, 200, {"tokens": tokens, "text": text,
                                        "finish_reason": outcome.finish_reason, "stats": stats(outcome)})
