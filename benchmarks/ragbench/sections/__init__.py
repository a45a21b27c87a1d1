"""The report's sections, one module each; importing this package registers them.

A section is ``fn(ctx) -> markdown`` registered with ``@section("name")``; its
measurements are worker stages ``fn(spec) -> dict`` registered with
``@worker_stage("name")`` in the same module and run through
``ctx.run_worker("name", system, corpus, **extra)``. Sections run (and appear
in BENCHMARKS.md) in the order of the imports below.
"""

from . import quality, scale, kernel, filters, operators, fields, sync, hybrid, ann, tfidf, refusal, serve, postgres, cli  # noqa: F401 - registration order = report order
