"""`tinyloop bench`: speed on the machine at hand, side by side with the alternatives.

    main.py            the command's arguments; one run from model to report
    plan.py            settings (quick or full, fitted to the model) and the measurements
    workers.py         the parent's side of a measuring worker process
    worker.py          a worker's side: JSON lines in, results out
    ops_tinyloop.py    TinyLoop's measurements (prefill, generate, speculative, diagnostics)
    ops_llama.py       llama.cpp's, through llama-cpp-python, on the same token ids
    runner.py          interleaved rounds over the workers
    engine_section.py  the engine figures: workers started, rounds run, figures made
    figures.py         runs -> medians with min and max, ratios, the speculative cost model
    serving/           the HTTP layer: tinyloop serve vs FastAPI + uvicorn on the same engine
    machine.py         CPU model, cores, BLAS
    report.py          tables (text, Markdown); plot.py: the PNG

Nothing here runs in the test suite's timing assertions: tests check the command runs
and its report is well formed, never how fast anything was.
"""
